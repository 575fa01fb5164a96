"""Every sentence that states a result is computed from the run. The text builders of the
notebooks, the report and the forecast's grading are found by name (`BUILDER_NAME`); each
must be listed here, and each listed one is fed a result where its claim holds and one where
it does not, and its text must change with it: either in a test of its own elsewhere
(`ELSEWHERE`: the test must exist and call it, or the function that calls it) or in a case
below (`FLIPS`). What is found by the name but states no result (a config rendered as text,
a layout of computed sentences) is listed in `NOT_RESULTS` with the reason. The notebooks'
markdown is read for sentences that state this run's results: there must be none.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lab_utils.forecast import band as band_mod
from lab_utils.forecast import grade
from lab_utils.notebook import lessons, time_split
from lab_utils.report import expected, plots, tables
from lab_utils.report import forecast as forecast_mod
from lab_utils.results.forecast import GradeRow
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult, RequestRecord

conclusions = importlib.import_module("lab_utils.report.conclusions")  # the package's
# `conclusions` is the function of that name

REPO = Path(__file__).resolve().parents[1]
SEARCHED = ["lab_utils/notebook", "lab_utils/report", "lab_utils/forecast",
            "lab_utils/results"]
BUILDER_NAME = re.compile(r"(sentence|conclu|verdict|_note$|caption|_text$|warning|^describe$"
                          r"|^explain|lines$|^summary$|_claims?$)")

# builder -> (its tests "path::function", space-separated: together they give it a result
# where its claim holds and one where it does not; the name each must call: the builder, or
# a function of the notebook or the report that reaches it)
ELSEWHERE = {
    "notebook/lessons.py:conclude_01": ("notebook/test_lessons.py::test_01_batching_paid_or_not",
                                        "conclude_01"),
    "notebook/lessons.py:conclude_02": (
        "notebook/test_lessons.py::test_02_fixed_cost_seen_or_not", "conclude_02"),
    "notebook/lessons.py:conclude_03": ("notebook/test_lessons.py::test_03_capacity_added_or_not",
                                        "conclude_03"),
    "notebook/lessons.py:conclude_04": ("notebook/test_lessons.py::test_04_itl_tail_protected_or_not",
                                        "conclude_04"),
    "notebook/lessons.py:conclude_tp": ("notebook/test_lessons.py::test_tp_output_and_cost_or_not",
                                        "conclude_tp"),
    "notebook/time_split.py:split_sentence": (
        "notebook/test_time_split.py::test_the_sentence_changes_with_the_data", "split_sentence"),
    "notebook/transfer_lesson.py:conclusions": (
        "notebook/test_transfer_lesson.py::test_bytes_and_time_against_02", "conclusions"),
    "notebook/transfer_lesson.py:stall_note": (
        "notebook/test_transfer_lesson.py::test_stall_note_only_when_a_run_stood_still",
        "stall_note"),
    "notebook/kv_lesson.py:explain_kv": (
        "notebook/test_kv_lesson.py::test_mla_and_plain_multi_head_layouts", "explain_kv"),
    "report/conclusions.py:conclusions": (
        "report/test_report.py::test_differences_inside_spread_are_no_difference", "conclusions"),
    "report/conclusions.py:_verdicts": (
        "report/test_report.py::test_disaggregation_loses_throughput_wins_itl_p99",
        "conclusions"),
    "report/conclusions.py:_warnings": ("report/test_report.py::test_failed_proof_is_a_warning",
                                        "conclusions"),
    "report/conclusions.py:_read_together_warning": (
        "report/test_report.py::test_runs_whose_tokens_were_read_together_are_named",
        "conclusions"),
    "report/conclusions.py:_stall_warning": (
        "report/test_report.py::test_runs_the_machine_stalled_in_are_named", "conclusions"),
    "report/verdict.py:verdict_claim": (
        "report/test_report.py::test_the_first_screen_has_the_verdict_sentence_the_banner_and_"
        "the_system report/test_report.py::test_the_verdict_sentence_when_nothing_differs_and_"
        "on_a_gpu", "build_report"),
    "report/verdict.py:verdict_sentence": (
        "report/test_report.py::test_the_first_screen_has_the_verdict_sentence_the_banner_and_"
        "the_system report/test_report.py::test_the_verdict_sentence_when_nothing_differs_and_"
        "on_a_gpu", "build_report"),
    "report/audit.py:result_sentences": (
        "report/test_audit.py::test_a_planted_false_claim_and_an_unbacked_sentence_are_caught",
        "audit"),
    "results/experiments.py:chunking_claim": (
        "notebook/test_switches.py::test_chunking_sentence_follows_the_numbers", "chunking_claim"),
    "results/experiments.py:others_claim": (
        "notebook/test_switches.py::test_the_short_prompts_sentence_quotes_each_setting",
        "others_claim"),
    "results/experiments.py:prefix_claim": (
        "notebook/test_switches.py::test_prefix_sentence_follows_the_numbers", "prefix_claim"),
    "report/conclusions.py:_summary_claim": (
        "report/test_report.py::test_disaggregation_loses_throughput_wins_itl_p99",
        "conclusions"),
    "report/conclusions.py:documentation_claim": (
        "report/test_report_claims.py::test_the_documentation_sentence_says_whether_the_run_"
        "agrees", "documentation_claim"),
    "results/experiments.py:policy_claims": (
        "report/test_report_claims.py::test_the_policy_sentence_names_the_win_and_its_cost",
        "policy_claims"),
    "report/verdict.py:_metric_verdict": (
        "report/test_report_claims.py::test_the_verdict_names_the_best_of_every_architecture",
        "verdict_claim"),
    "report/summary.py:machine_claim": (
        "report/test_report_claims.py::test_one_machine_is_said_with_the_cores_each_sweep_used",
        "machine_claim"),
    "report/when_pd.py:sentences": ("report/test_when_pd.py::test_sentences_follow_the_table",
                                    "sentences"),
    # methods: Conclusions.sentences joins what `conclusions` built; Audit.lines says what
    # the audit found (its planted-claim test flips it)
    "report/conclusions.py:sentences": (  # read there as the property it is
        "report/test_report.py::test_differences_inside_spread_are_no_difference", "sentences"),
    "notebook/agenda.py:start_lines": (
        "test_workshop.py::test_the_timetable_names_the_start_ups_the_dress_run_measured",
        "start_lines"),
    "notebook/timings.py:optional_lines": (
        "notebook/test_notebook_eta.py::"
        "test_eta_says_what_each_optional_part_took_in_the_last_runs", "optional_lines"),
    "report/audit.py:lines": (
        "report/test_audit.py::test_a_planted_false_claim_and_an_unbacked_sentence_are_caught",
        "audit"),
}

NOT_RESULTS = {
    "notebook/card.py:card_lines": "a pair's card: the config's addresses and commands",
    "notebook/forecasting.py:eta_lines": "predicted times, not results (tests/notebook/test_eta.py)",
    "notebook/timings.py:whole_notebook_lines": "predicted times, not results "
                                                    "(tests/notebook/test_notebook_eta.py)",
    "notebook/hood.py:command_lines": "the commands a cell runs, shown before it runs them",
    "notebook/lessons.py:conclusions_of": "lists sentences the conclude_0N builders computed",
    "notebook/steps.py:conclude": "loads the notebook's results and calls conclude_0N",
    "notebook/steps.py:conclude_transfer": "loads the results and calls transfer_lesson.conclusions",
    "notebook/triage.py:triage_text": "the known failures and their fixes, from known_failures",
    "report/sections.py:verdict_table": "lays out conclusions()'s findings as a table",
    "report/sections.py:_verdict_blocks": "lays out verdict_sentence and conclusions() on the page",
    "report/sections.py:_conclusion_blocks": "lays out conclusions()'s sentences on the page",
    "report/sections.py:_sweep_text": "the configured sweep (loads, repeats) in words",
    "report/summary.py:workloads_text": "the recorded workloads in words (WorkloadConfig.describe)",
    "forecast/grade.py:summary": "the grading's figures; grade.sentences says them (below)",
    "forecast/grade.py:grade_claims": "grade.sentences' sentences (flipped below) as claims",
    "results/experiments.py:switch_claims": "lists the three switch builders' claims",
    "report/summary.py:report_claims": "lists the report's claims, each built and flipped above",
    "report/summary.py:together_claim": "coverage_sentence (flipped below) in a claim",
    "report/summary.py:experiment_claims": "lists the side experiments' claims, flipped above",
    "results/claims.py:load_claims": "reads claims.json",
    "results/claims.py:save_claims": "writes claims.json",
    "results/store.py:reference_note": "names where a reference run's results came from",
}


def builders() -> set[str]:
    found = set()
    for top in SEARCHED:
        for path in sorted((REPO / top).glob("*.py")):
            top_level = ast.parse(path.read_text()).body
            methods = [m for c in top_level if isinstance(c, ast.ClassDef) for m in c.body]
            for node in top_level + methods:  # functions, and methods of classes
                if isinstance(node, ast.FunctionDef) and BUILDER_NAME.search(node.name):
                    found.add(f"{path.relative_to(REPO / 'lab_utils')}:{node.name}")
    return found


# ---- flips of the builders no other test flips -------------------------------------------

def c1(itl: float) -> BenchmarkResult:
    return BenchmarkResult(target="t", model="m", workload={}, points=[], combined=[
        {"mode": "concurrency", "value": 1.0, "valid": True, "repeats": 1, "median_itl_ms": itl}])


def probe(gbps: dict[int, float]) -> list[dict]:
    return [{"seg_type": "DRAM", "op": "READ", "bytes": b, "bandwidth_GBps": g}
            for b, g in gbps.items()]


def band_of(factor: float) -> dict:
    return {"families": {"TTFT p50": {"factor": factor, "n": 6}}, "quantile": 0.9,
            "floor_pct": 10, "source": "the model's own error on 01 (6 graded values)"}


def graded_rows(errors: list[float]) -> list[GradeRow]:
    """Rows whose measurement is `e`% off the prediction of 10 (interval 8-12)."""
    return [GradeRow("median_ttft_ms", 10.0 * (1 + e / 100), 10.0, lo=8.0, hi=12.0,
                     load="concurrency 1", differs=abs(e) > 10) for e in errors]


def table(valid: list[bool], repeats: int = 2) -> pd.DataFrame:
    return pd.DataFrame([{"architecture": a, "load": "concurrency 4", "valid": v,
                          "repeats": repeats, "spread_pct": 5.0}
                         for a, v in zip(("baseline", "replicated"), valid, strict=True)])


def stalled(held_up: float) -> BenchmarkResult:
    point = BenchmarkPoint(mode="concurrency", value=4.0, repeat=0,
                           summary={"held_up_s": held_up}, requests=[])
    return BenchmarkResult(target="t", model="m", workload={}, points=[point], combined=[])


def record(read_together: int, ttft: float) -> RequestRecord:
    return RequestRecord(index=0, prompt_len=128, max_tokens=4, ttft_ms=ttft,
                         itl_ms=[2.0, 0.0 if read_together else 2.5, 3.0],
                         read_together=read_together, e2el_ms=ttft + 7.0, tpot_ms=2.3,
                         completion_tokens=4)


def roof(limit: float | None) -> SimpleNamespace:
    r = SimpleNamespace(max_tokens_per_s_per_stream=limit, memory_bandwidth_GBps=None,
                        weight_bytes=None)
    return SimpleNamespace(baseline=SimpleNamespace(roofline=r), sweeps={})


# builder -> (its text where the claim holds, its text where it does not, a phrase of the
# first that must not be in the second)
def pair(replicated: float, baseline: float) -> list:
    """replicated against baseline on ITL p99 at concurrency 1, each one run."""
    from lab_utils.results.claims import comparison
    from lab_utils.results.points import Point

    def pt(v: float) -> Point:
        return Point.model_validate({"mode": "concurrency", "value": 1.0, "repeats": 1,
                                     "p99_itl_ms": {"median": v, "min": v, "max": v, "n": 1}})
    return [comparison("p99_itl_ms", ("replicated", "03", "sweep", pt(replicated)),
                       ("baseline", "01", "sweep", pt(baseline)))]


FLIPS = {
    "report/conclusions.py:_pair_claim": lambda: (
        conclusions._pair_claim(pair(4.0, 8.0), "standard", "replicated", "baseline",
                                "the single instance").text,
        conclusions._pair_claim(pair(8.0, 4.0), "standard", "replicated", "baseline",
                                "the single instance").text,
        "won on ITL p99 at concurrency 1"),
    "report/forecast.py:_verdict": lambda: (
        forecast_mod._verdict(GradeRow("median_ttft_ms", 10.0, 11.0, lo=9.0, hi=12.0)),
        forecast_mod._verdict(GradeRow("median_ttft_ms", 10.0, 13.0, lo=9.0, hi=12.0)),
        "inside"),
    "notebook/lessons.py:best_transfer_sentence": lambda: (
        lessons.best_transfer_sentence(probe({1 << 20: 2.0, 4 << 20: 3.0})),
        lessons.best_transfer_sentence(probe({1 << 19: 3.5, 4 << 20: 1.0})),
        "its largest transfer: there the two agree by construction"),
    "notebook/time_split.py:itl_claim": lambda: (
        time_split.itl_claim(c1(2.0), c1(3.0)).text, time_split.itl_claim(c1(3.0), c1(1.5)).text,
        "(1.5x higher)"),
    "results/sweep.py:describe": lambda: (
        record(1, 40.0).describe(), record(0, 90.0).describe(),
        "1 of them 0 ms: tokens the client read together"),
    "forecast/band.py:band_sentence": lambda: (
        band_mod.band_sentence(band_of(1.25)), band_mod.band_sentence(band_of(2.5)),
        "TTFT p50 by a factor of 1.25 either way"),
    "forecast/band.py:coverage_sentence": lambda: (
        band_mod.coverage_sentence({"graded": 4, "inside": 4, "median_width": 0.5}),
        band_mod.coverage_sentence({"graded": 4, "inside": 1, "median_width": 0.5}),
        "4 of 4 graded values (100%)"),
    "forecast/grade.py:sentences": lambda: (
        grade.sentences("replicated", graded_rows([5.0, -8.0, 12.0])),
        grade.sentences("replicated", graded_rows([35.0, -40.0, 50.0])),
        "within the 25% goal"),
    "report/tables.py:percentile_text": lambda: (
        tables.percentile_text("p99_ttft_ms", "812.4", pd.Series({"n_requests": 24})),
        tables.percentile_text("p99_ttft_ms", "812.4", pd.Series({"n_requests": 480})),
        "~max"),
    "report/tables.py:_spread_text": lambda: (
        tables._spread_text(pd.Series({"valid": True, "repeats": 3, "spread_pct": 4.2})),
        tables._spread_text(pd.Series({"valid": True, "repeats": 1, "spread_pct": 4.2})),
        "4.2% (3 repeats)"),
    "report/tables.py:_repeat_note": lambda: (
        tables._repeat_note(stalled(2.5), "concurrency", 4.0),
        tables._repeat_note(stalled(0.0), "concurrency", 4.0),
        "stood still 2.5 s"),
    "report/conclusions.py:_spread_sentence": lambda: (
        conclusions._spread_sentence(table([True, True], repeats=1)),
        conclusions._spread_sentence(table([True, True], repeats=3)),
        "Points measured once (baseline, replicated)"),
    "report/plots.py:_invalid_caption": lambda: (
        plots._invalid_caption(table([True, False])), plots._invalid_caption(table([True, True])),
        "Invalid here: replicated at concurrency 4."),
    "report/plots.py:roofline_claim": lambda: (
        plots.roofline_claim(roof(17.0)).text, str(plots.roofline_claim(roof(None))),
        "at most 17"),
    "report/plots.py:roofline_text": lambda: (
        plots.roofline_text(roof(17.0)), plots.roofline_text(roof(None)), "at most 17"),
    "report/expected.py:_verdict": lambda: (
        expected._verdict(expected.Observed(5.0, "01"), 20.0),
        expected._verdict(expected.Observed(18.0, "01"), 20.0), "4.0x below"),
}


def test_every_text_builder_is_flipped_or_states_no_result():
    found = builders()
    listed = set(ELSEWHERE) | set(FLIPS) | set(NOT_RESULTS)
    assert not found - listed, f"text builders no test flips: {sorted(found - listed)}"
    assert not listed - found, f"listed but gone: {sorted(listed - found)}"


def _names(func: ast.AST) -> set[str]:
    return {getattr(n, "id", None) or getattr(n, "attr", None)
            for n in ast.walk(func) if isinstance(n, ast.Name | ast.Attribute)}


def _function(path: Path, name: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == name)


@functools.cache
def _call_graph() -> dict[str, set[str]]:
    calls: dict[str, set[str]] = {}
    for path in (REPO / "lab_utils").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                calls.setdefault(node.name, set()).update(_names(node))
    return calls


def _reaches(start: str, target: str) -> bool:
    """Whether the function named `start` reaches one named `target`, over every function
    of lab_utils by name (a name two modules share counts for both)."""
    calls = _call_graph()
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == target:
            return True
        if name not in seen:
            seen.add(name)
            todo += [n for n in calls.get(name, ()) if n in calls]
    return False


@pytest.mark.parametrize("builder", sorted(ELSEWHERE))
def test_the_flip_test_elsewhere_exists_and_calls_the_builder(builder):
    tests, via = ELSEWHERE[builder]
    for test in tests.split():
        file, func = test.split("::")
        assert via in _names(_function(REPO / "tests" / file, func)), f"{test} calls no {via}"
    assert _reaches(via, builder.split(":")[1]), f"{via} does not reach {builder}"


@pytest.mark.parametrize("builder", sorted(FLIPS))
def test_the_text_changes_when_the_claim_is_false(builder):
    holds, fails, phrase = FLIPS[builder]()
    text_holds, text_fails = ("\n".join(t) if isinstance(t, list) else t for t in (holds, fails))
    assert phrase in text_holds, text_holds
    assert phrase not in text_fails, text_fails
    assert text_holds != text_fails


# a markdown sentence about this run's results: a result word next to "this run"/"here"
RESULT_WORD = re.compile(r"\b(was|were|won|lost|beat|faster|slower|higher|lower|fell|rose)\b",
                         re.I)
THIS_RUN = re.compile(r"\b(this run|here|on this machine|this machine)\b", re.I)
SAYS_WHERE = re.compile(r"\b(computed|says|prints|shows|will|whether|which|if|when)\b|\?", re.I)


def claims(sentences: list[str]) -> list[str]:
    return [s for s in sentences if RESULT_WORD.search(s) and THIS_RUN.search(s)
            and not SAYS_WHERE.search(s)]


def test_a_claim_in_markdown_would_be_found():
    assert claims(["Here replicated serving was 1.3x faster than the single instance.",
                   "The report says which architecture was faster here.",
                   "Which policy will show the lower ITL p99 here?"]) == [
        "Here replicated serving was 1.3x faster than the single instance."]


def test_the_notebooks_markdown_states_no_result_of_this_run():
    found = []
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                text = "".join(cell["source"])
                found += [f"{path.name} {cell.get('id')}: {s.strip()[:120]}"
                          for s in claims(re.split(r"(?<=[.!?])\s+", text))]
    assert not found, "markdown that states a result (compute it in a builder):\n" + \
        "\n".join(found)
