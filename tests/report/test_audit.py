"""The audit: every claim the notebooks and the report saved is checked again against the
results files, and a result sentence no claim backs is found, in the report and in an
executed notebook."""

from __future__ import annotations

import json

from report.test_report import write_loses_throughput_wins_itl

from lab_utils import report
from lab_utils.cli import main
from lab_utils.notebook import steps
from lab_utils.report.audit import audit, result_sentences
from lab_utils.results.claims import CLAIMS_FILE, load_claims, save_claims


def _run(cfg):
    write_loses_throughput_wins_itl(cfg)
    steps.conclude(cfg, "03")
    steps.conclude(cfg, "04")
    report.build_report(cfg)
    return cfg.results_dir


def test_a_run_audits_clean_and_each_claim_is_checked(test_cfg, capsys):
    out = _run(test_cfg)
    book = load_claims(out)
    assert set(book) == {"03", "04", "report"}
    found = audit(out)
    assert found.false == [] and found.checked >= 40, found.lines()
    report_lines = [line for where, line in result_sentences(out) if where == "report"]
    assert report_lines and not [u for u in found.unbacked if u[0] == "report"], found.unbacked
    assert main(["audit", str(out)]) == 0
    assert "0 false, 0 unbacked sentences" in capsys.readouterr().out


def test_a_planted_false_claim_and_an_unbacked_sentence_are_caught(test_cfg, capsys):
    out = _run(test_cfg)
    book = load_claims(out)
    # the report says disaggregation won ITL p99 at concurrency 4: plant the opposite verdict
    won = next(c for c in book["report"] if c.text.startswith("Disaggregation won on ITL p99"))
    planted = won.model_copy(deep=True)
    planted.text = "Replicated serving won on ITL p99 at concurrency 4."
    for cmp in planted.comparisons:
        cmp.better = "reference"
    # and a claim whose numbers are not the results'
    moved = won.model_copy(deep=True)
    moved.text = "Disaggregated ITL p99 was 1 ms."
    moved.comparisons[0].subject.value.median = 1.0
    save_claims(out, "planted", [planted, moved])
    md = out / "report.md"
    md.write_text(md.read_text() + "\nDisaggregation was 9x faster than everything at "
                                   "concurrency 64.\n")
    nb = out / "executed" / "03_Replicated_Serving.ipynb"
    nb.parent.mkdir(parents=True, exist_ok=True)
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "stream", "name": "stdout",
         "text": ["- Replicas won 3x on TTFT p50 at concurrency 2.\n", "written: x.json\n"]}]}]}))
    found = audit(out)
    false = {c.text: why for c, why in found.false}
    assert set(false) == {planted.text, moved.text}
    assert "the rule now says disaggregated" in " ".join(false[planted.text])
    assert "the claim says 1" in " ".join(false[moved.text])
    assert sorted(found.unbacked) == [
        ("03_Replicated_Serving", "- Replicas won 3x on TTFT p50 at concurrency 2."),
        ("report", "Disaggregation was 9x faster than everything at concurrency 64.")]
    assert main(["audit", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "2 false, 2 unbacked sentences" in printed
    assert "FALSE (report): Replicated serving won on ITL p99" in printed


def test_no_claims_file_names_the_fix(tmp_path, capsys):
    assert main(["audit", str(tmp_path)]) == 2
    assert f"no {CLAIMS_FILE}" in capsys.readouterr().err
