"""A whole notebook's ETA (`notebook.timings`): each cell from the last runs on this
profile when the workload and engine settings are unchanged, else the forecast for the
cells that start or measure a topology, else this series' median cell, named; no ETA when a
serving step has nothing to be predicted from. And the cells' kinds are read from the
notebooks as they are, so the ETA follows them."""

from __future__ import annotations

import nbformat
import pytest

from lab_utils.forecast.model import loads_of
from lab_utils.forecast.run import architecture_of
from lab_utils.forecast.timing import minutes, sweep_seconds
from lab_utils.notebook import eta_inputs, forecasting
from lab_utils.notebook.optional import SKIPPED, optional_parts, skip_optional
from lab_utils.notebook.starts import start_estimate
from lab_utils.notebook.timings import (
    cell_eta,
    cell_seconds,
    load_timings,
    notebook_eta,
    optional_lines,
    record_notebook,
    settings_digest,
    step_of,
)
from lab_utils.results import write_results
from lab_utils.results.forecast import Forecast, TimedProfile
from lab_utils.runner import _against, find_notebooks

from support.eta_records import starts, write_01_02
from support.payloads import model, sweep_dict


def book(tmp_path, name: str, cells: dict[str, str], took: dict[str, float] | None = None):
    """A notebook file `name` with these code cells (id -> source); with `took`, the
    executed copy nbclient would leave, stamped with each cell's seconds."""
    nb = nbformat.v4.new_notebook()
    for cid, source in cells.items():
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = cid
        if took and cid in took:
            ms = int(took[cid] * 1000)
            cell["metadata"]["execution"] = {
                "iopub.execute_input": "2026-11-27T10:00:00.000000Z",
                "shell.execute_reply": f"2026-11-27T10:{ms // 60000:02d}:"
                                       f"{ms % 60000 // 1000:02d}.{ms % 1000:03d}000Z"}
        nb.cells.append(cell)
    path = tmp_path / name
    nbformat.write(nb, path)
    return path, nb


def test_cell_seconds_are_read_from_nbclients_stamps(tmp_path):
    _, nb = book(tmp_path, "00_x.ipynb", {"a": "1", "b": "2", "c": "3"}, {"a": 1.25, "b": 75.5})
    assert cell_seconds(nb) == {"a": 1.25, "b": 75.5}  # c was never run: no stamp


def test_the_last_run_predicts_every_cell_until_the_workload_changes(test_cfg, tmp_path):
    path, nb = book(tmp_path, "03_x.ipynb", {"a": "x = 1", "b": "session.start('replicated')"},
                    {"a": 2.0, "b": 30.0})
    record_notebook(test_cfg, path.name, nb, wall_s=35.0, series="first")
    assert load_timings(test_cfg)["notebooks"][path.name]["kernel_s"] == 3.0
    eta = notebook_eta(test_cfg, path, series="second")
    assert eta.seconds == 35.0 and eta.parts == {"kernel start": 3.0, "last runs": 32.0}
    assert eta.line() == "ETA about 35 s (kernel start 3 s, last runs 32 s)"
    # the kernel's start is the median over the last run's notebooks: one varies by seconds
    for name, kernel in (("01_x.ipynb", 1.0), ("02_x.ipynb", 1.2)):
        p, executed = book(tmp_path, name, {"a": "x = 1"}, {"a": 2.0})
        record_notebook(test_cfg, name, executed, wall_s=2.0 + kernel, series="first")
    assert notebook_eta(test_cfg, path, series="second").parts["kernel start"] == 1.2
    other = test_cfg.model_copy(update={"workload": test_cfg.workload.model_copy(
        update={"num_prompts": test_cfg.workload.num_prompts + 1})})
    assert notebook_eta(other, path, series="second") is None  # nothing measured applies


def test_a_cell_is_its_median_over_the_last_three_runs(test_cfg, tmp_path):
    path = tmp_path / "05_x.ipynb"
    for series, secs in (("1", 9.0), ("2", 2.0), ("3", 3.0), ("4", 2.5)):
        _, nb = book(tmp_path, path.name, {"a": "table()"}, {"a": secs})
        record_notebook(test_cfg, path.name, nb, wall_s=secs + 1.0, series=series)
    kept = load_timings(test_cfg)["notebooks"][path.name]
    assert [kept["cells"]["a"]] + [e["cells"]["a"] for e in kept["earlier"]] == [2.5, 3.0, 2.0]
    assert "earlier" not in kept["earlier"][0]  # one level: the runs before it
    assert notebook_eta(test_cfg, path, series="5").parts["last runs"] == 2.5  # not 9 s


def test_a_first_run_counts_cells_not_seen_as_this_series_median_cell(test_cfg, tmp_path):
    p00, nb00 = book(tmp_path, "00_x.ipynb", {"a": "1", "b": "2", "c": "3"},
                     {"a": 1.0, "b": 3.0, "c": 0.2})
    record_notebook(test_cfg, p00.name, nb00, wall_s=6.2, series="s")  # kernel 2 s
    p05, _ = book(tmp_path, "05_x.ipynb", {"d": "table()", "e": "plot()", "f": ""})
    eta = notebook_eta(test_cfg, p05, series="s")
    assert eta.seconds == 2.0 + 2 * 1.0 and eta.parts == {"kernel start": 2.0,
                                                          "median cell": 2.0}
    assert eta.guessed == ["d `table()`", "e `plot()`"]  # the empty cell counts nothing
    assert "2 cell(s) not measured before" in eta.line()
    assert notebook_eta(test_cfg, p05, series="another") is None  # nothing of that series


def test_a_serving_step_nothing_can_predict_means_no_eta(test_cfg, tmp_path):
    p00, nb00 = book(tmp_path, "00_x.ipynb", {"a": "1"}, {"a": 1.0})
    record_notebook(test_cfg, p00.name, nb00, wall_s=2.0, series="s")
    p01, _ = book(tmp_path, "01_x.ipynb", {"s": 'served = session.start("baseline")',
                                           "w": "result = lab.run_sweep(cfg, served)"})
    eta = notebook_eta(test_cfg, p01, series="s")  # no start measured, no engine profile
    assert eta.missing == ["start", "sweep"] and eta.line().startswith("no ETA yet: ")


def after_01(cfg, tmp_path) -> None:
    """A series that has run 00 and measured 01's profile and 02's probe, with both nodes'
    first replica starts recorded."""
    write_01_02(cfg)
    starts(cfg, "spark-01", ("replica", 20.0, True, "2026-11-27"))
    starts(cfg, "spark-02", ("replica", 22.0, True, "2026-11-27"))
    p00, nb00 = book(tmp_path, "00_x.ipynb", {"a": "1"}, {"a": 1.0})
    record_notebook(cfg, p00.name, nb00, wall_s=3.0, series="s")


def test_serving_cells_are_forecast_from_01_and_the_measured_starts(test_cfg, tmp_path):
    after_01(test_cfg, tmp_path)
    p03, _ = book(tmp_path, "03_x.ipynb", {
        "s": 'served = session.start("replicated")',
        "w": "result = lab.run_sweep(cfg, served)",
        "m": "mixed = lab.run_sweep(cfg, served, mixed=True)",
        "p": "lab.compare_policies(cfg, session, served)"})
    eta = notebook_eta(test_cfg, p03, series="s")
    inputs, cores, _ = eta_inputs(test_cfg)
    arch, w = architecture_of(test_cfg, "replicated", cores), test_cfg.workload
    one = w.model_copy(update={"repeats": 1})
    expected = (forecasting.startup_seconds(test_cfg, "replicated")[0]
                + sweep_seconds(inputs, arch, w) + sweep_seconds(inputs, arch, w, mixed=True)
                + 2 * sweep_seconds(inputs, arch, one, mixed=True))
    assert eta.parts["forecast"] == pytest.approx(expected) and not eta.missing
    assert forecasting.startup_seconds(test_cfg, "replicated")[0] == 22.0
    # 01's sweep and mixed run (the checkout's cells) each measured 2 s per run more than
    # their forecast: every run of 03 adds that
    (real01,) = find_notebooks(start="01", stop="01")
    ids = {step_of(c.source): c["id"] for c in nbformat.read(real01, as_version=4).cells
           if c.cell_type == "code"}
    base = architecture_of(test_cfg, "baseline", cores)
    runs, mixed_runs = (len(loads_of(w, mixed=m)) * w.repeats for m in (False, True))
    took = {ids["sweep"]: sweep_seconds(inputs, base, w) + 2.0 * runs,
            ids["mixed"]: sweep_seconds(inputs, base, w, mixed=True) + 2.0 * mixed_runs}
    p01, nb01 = book(tmp_path, "01_x.ipynb", {cid: "" for cid in took}, took)
    record_notebook(test_cfg, p01.name, nb01, wall_s=60.0, series="s")
    again = notebook_eta(test_cfg, p03, series="s")
    assert again.parts["forecast"] == pytest.approx(expected + 2.0 * (runs + mixed_runs + 2),
                                                    abs=0.05)


@pytest.mark.parametrize("nb, kinds", [
    ("01", {"start", "sweep", "mixed", "switches"}),
    ("03", {"start", "sweep", "mixed", "policies"}),
    ("04", {"start", "sweep", "mixed", "front doors", "tp start", "tp sweep", "tp mixed"})])
def test_the_notebooks_serving_cells_are_recognised(nb, kinds):
    (path,) = find_notebooks(start=nb, stop=nb)
    found = {step_of(c.source) for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "code"}
    assert found - {None} == kinds


def test_the_split_models_cells_are_forecast_as_the_split_model(test_cfg, tmp_path):
    """04's optional section: its start from the measured starts, its sweeps from the
    model of the split instance (not the P/D pair's), calibrated on its timed requests
    once a run recorded them; nothing at all on a profile without it."""
    from dataclasses import replace

    from lab_utils.forecast.timed import calibrate
    from lab_utils.notebook.cell_forecast import forecast_cell
    from lab_utils.notebook.forecasting import allreduce_inputs

    write_01_02(test_cfg)
    starts(test_cfg, "spark-01", ("replica", 20.0, True, "2026-11-27"))
    starts(test_cfg, "spark-02", ("replica", 22.0, True, "2026-11-27"))
    found = eta_inputs(test_cfg)
    inputs, cores, _ = found
    w = test_cfg.workload
    arch = architecture_of(test_cfg, "tensor-parallel", cores)
    per_token, rate, _ = allreduce_inputs(test_cfg)
    split = replace(inputs, allreduce_bytes_per_token=per_token, link_bytes_per_ms=rate)
    assert forecast_cell(test_cfg, "04", "tp start", found, 0.0) == 22.0
    untimed = forecast_cell(test_cfg, "04", "tp sweep", found, 0.0)
    assert untimed == pytest.approx(sweep_seconds(split, arch, w))
    assert untimed != pytest.approx(forecast_cell(test_cfg, "04", "sweep", found, 0.0))
    # a recorded run's timed split instance (20 ms per token) calibrates the next ETA
    from lab_utils.notebook import make_forecast
    from lab_utils.results import TensorParallelPayload, load_results, write_results
    from lab_utils.results.forecast import TimedProfile

    timed = TimedProfile(requests=6, prompt_tokens=w.input_len, ttft_ms=300.0, step_ms=20.0,
                         parts={})
    fc = make_forecast(test_cfg, "tensor-parallel", timed=timed)
    sweep = load_results(test_cfg, "01").payload.sweep
    write_results(test_cfg, "tp", TensorParallelPayload(
        topology="tensor-parallel", instances=[], sweep=sweep, ranks=2, same_output=[],
        forecast=fc), software={}, hardware={})
    calibrated, _ = calibrate(split, arch, timed, w.output_len, w.seed)
    timed_eta = forecast_cell(test_cfg, "04", "tp mixed", found, 0.5)
    assert timed_eta == pytest.approx(sweep_seconds(calibrated, arch, w, mixed=True)
                                      + 0.5 * w.repeats)
    assert sweep_seconds(calibrated, arch, w, mixed=True) > sweep_seconds(split, arch, w,
                                                                          mixed=True)
    bare = test_cfg.model_copy(deep=True)
    bare.topology.tensor_parallel = None
    assert forecast_cell(bare, "04", "tp sweep", found, 0.0) == 0.0


def test_the_runner_says_how_far_the_eta_was():
    assert _against(80.0, 83.0) == " (ETA 80 s: 4% under)"
    assert _against(60.0, 50.0) == " (ETA 60 s: 20% over)"
    assert _against(None, 50.0) == ""


def test_a_node_never_started_takes_the_slowest_first_start_measured_on_another(test_cfg,
                                                                             tmp_path):
    write_01_02(test_cfg)
    p03, _ = book(tmp_path, "03_x.ipynb", {"s": 'served = session.start("replicated")'})
    p00, nb00 = book(tmp_path, "00_x.ipynb", {"a": "1"}, {"a": 1.0})
    record_notebook(test_cfg, p00.name, nb00, wall_s=2.0, series="s")
    assert notebook_eta(test_cfg, p03, series="s").missing == ["start"]  # none anywhere
    starts(test_cfg, "spark-01", ("baseline", 21.0, True, "2026-11-27"),
           ("baseline", 19.0, False, "2026-11-27"))  # 01 started here; spark-02 never
    assert forecasting.startup_seconds(test_cfg, "replicated")[1].startswith("the agenda's")
    assert notebook_eta(test_cfg, p03, series="s").parts["forecast"] == 21.0
    assert start_estimate(test_cfg, "replicated") == (
        21.0, "the slowest first start measured, on spark-01; not every node has started one")


def test_the_comparisons_front_door_starts_are_03s_measured_ones(test_cfg, tmp_path):
    write_01_02(test_cfg)
    starts(test_cfg, "spark-01", ("replica", 20.0, True, "2026-11-27"))
    starts(test_cfg, "spark-02", ("replica", 20.0, True, "2026-11-27"))
    inputs, cores, _ = eta_inputs(test_cfg)
    w = test_cfg.workload
    one = w.model_copy(update={"repeats": 1})
    (real03,) = find_notebooks(start="03", stop="03")
    policies = next(c["id"] for c in nbformat.read(real03, as_version=4).cells
                    if c.cell_type == "code" and step_of(c.source) == "policies")
    runs = 2 * sweep_seconds(inputs, architecture_of(test_cfg, "replicated", cores), one,
                             mixed=True)
    p03, nb03 = book(tmp_path, "03_x.ipynb", {policies: ""}, {policies: runs + 3 * 1.5})
    record_notebook(test_cfg, p03.name, nb03, wall_s=30.0, series="s")
    p04, _ = book(tmp_path, "04_x.ipynb", {"d": "doors = lab.compare_front_doors(cfg, s, x)"})
    low = one.model_copy(update={"concurrency": [min(w.concurrency)], "request_rates": []})
    doors = 2 * sweep_seconds(inputs, architecture_of(test_cfg, "disaggregated", cores), low)
    assert notebook_eta(test_cfg, p04, series="s").parts["forecast"] == pytest.approx(
        doors + 3 * 1.5, abs=0.05)


def test_a_serving_cells_eta_is_its_last_runs_else_the_forecast_with_01s_per_run_cost(
        test_cfg, tmp_path):
    write_01_02(test_cfg)
    inputs, cores, _ = eta_inputs(test_cfg)
    w = test_cfg.workload
    arch = architecture_of(test_cfg, "replicated", cores)
    (real01,) = find_notebooks(start="01", stop="01")
    (real03,) = find_notebooks(start="03", stop="03")

    def cell(path, kind):
        return next(c for c in nbformat.read(path, as_version=4).cells
                    if c.cell_type == "code" and step_of(c.source) == kind)

    sweep03 = cell(real03, "sweep")
    plain = cell_eta(test_cfg, "03", sweep03.source)
    assert plain == (f"about {minutes(sweep_seconds(inputs, arch, w))} (forecast from 01's "
                     "engine profile)")  # nothing recorded yet
    assert cell_eta(test_cfg, "03", "x = 1") is None  # serves nothing
    assert cell_eta(test_cfg, "03", cell(real03, "start").source) is None  # prints its own
    sweep01 = cell(real01, "sweep")["id"]
    base = architecture_of(test_cfg, "baseline", cores)
    runs = len(loads_of(w)) * w.repeats
    p01, nb01 = book(tmp_path, "01_x.ipynb", {sweep01: ""},
                     {sweep01: sweep_seconds(inputs, base, w) + 0.5 * runs})
    record_notebook(test_cfg, p01.name, nb01, wall_s=60.0, series="any")
    said = cell_eta(test_cfg, "03", sweep03.source)
    assert said == (f"about {minutes(sweep_seconds(inputs, arch, w) + 0.5 * runs)} (forecast "
                    "from 01's engine profile, and 0.5 s per run outside the requests as "
                    "01's sweep measured it)")
    # once 03's cell ran here with these settings, its own time is the ETA
    p03, nb03 = book(tmp_path, "03_x.ipynb", {sweep03["id"]: ""}, {sweep03["id"]: 42.0})
    record_notebook(test_cfg, p03.name, nb03, wall_s=50.0, series="any")
    assert cell_eta(test_cfg, "03", sweep03.source) == (
        f"about {minutes(42.0)} (this cell's median over its last runs here)")


def test_the_session_prints_a_serving_cells_eta_before_it_runs(test_cfg, capsys):
    from types import SimpleNamespace

    from lab_utils.notebook.session import ServingSession

    write_01_02(test_cfg)
    (real03,) = find_notebooks(start="03", stop="03")
    sweep = next(c.source for c in nbformat.read(real03, as_version=4).cells
                 if c.cell_type == "code" and step_of(c.source) == "sweep")
    session = ServingSession(test_cfg)
    session._before_cell(SimpleNamespace(raw_cell=sweep))
    assert capsys.readouterr().out == ""  # nothing started: nothing to say
    session.notebook = "03"  # as its first start sets it
    session._before_cell(SimpleNamespace(raw_cell=sweep))
    assert capsys.readouterr().out.startswith("this cell: about ")
    session._before_cell(SimpleNamespace(raw_cell="print(1)"))
    assert capsys.readouterr().out == ""


# ---- optional parts (`run --skip-optional`) -----------------------------------------------


def _names(source: str, ctx: type) -> set[str]:
    import ast

    tree = ast.parse("\n".join(ln for ln in source.splitlines() if not ln.startswith("%")))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


@pytest.mark.parametrize("path", find_notebooks(), ids=lambda p: p.name)
def test_a_skipped_part_leaves_no_name_undefined_for_the_cells_after_it(path):
    """Every name an optional cell sets and a later cell that still runs reads is set by
    the stand-in `skip_optional` runs in its place; the parts are the ones the kit names."""
    import ast

    nb = nbformat.read(path, as_version=4)
    parts = optional_parts(nb)
    expected = {"01": ["Optional: two switches, chunked prefill and prefix caching"],
                "04": ["Optional: vLLM's router as the front door",
                       "Optional: the third way, one model across both nodes"]}
    assert list(parts) == expected.get(path.name[:2], [])
    skipped = nbformat.read(path, as_version=4)
    assert skip_optional(skipped) == list(parts)
    optional = {cid for ids in parts.values() for cid in ids}
    set_by_optional: set[str] = set()
    for original, now in zip(nb.cells, skipped.cells, strict=True):
        if original.cell_type != "code":
            continue
        if original["id"] in optional:
            assert now.metadata[SKIPPED] and "skipped (run --skip-optional)" in now.source
            set_by_optional |= _names(original.source, ast.Store)
            set_by_optional -= _names(now.source, ast.Store)  # the stand-in sets it
        else:
            left = _names(original.source, ast.Load) & set_by_optional
            assert not left, f"cell {original['id']} reads {left}, set only by a skipped part"


def test_skipped_cells_are_not_timed_and_the_eta_leaves_them_out(test_cfg, tmp_path):
    path, nb = book(tmp_path, "04_x.ipynb", {"a": "x = 1", "o": "tp = lab.start()",
                                             "p": "if tp:\n    lab.run_sweep(cfg, tp)"},
                    {"a": 2.0, "o": 40.0, "p": 60.0})
    for cid in ("o", "p"):
        nb.cells[[c["id"] for c in nb.cells].index(cid)].metadata["tags"] = ["optional"]
    nb.cells[1].metadata["skipped_as"] = "tp = None"
    nbformat.write(nb, path)
    record_notebook(test_cfg, path.name, nb, wall_s=103.0, series="first")
    assert notebook_eta(test_cfg, path, "second").parts["last runs"] == 102.0
    assert notebook_eta(test_cfg, path, "second", skip=True).parts["last runs"] == 2.0
    skip_optional(nb)
    assert nb.cells[1].source.startswith("tp = None\n") and cell_seconds(nb) == {"a": 2.0}


def test_eta_says_what_each_optional_part_took_in_the_last_runs(test_cfg):
    """`optional_lines`: per optional part of the checkout's notebooks, the sum of its cells'
    last-run times here, or that it has not run here yet."""
    import json

    (nb04,) = [p for p in find_notebooks() if p.name.startswith("04")]
    parts = optional_parts(nbformat.read(nb04, as_version=4))
    router, split = parts.values()
    cells = {router[0]: 20.0, **{cid: 10.0 for cid in split}, "not-optional": 99.0}
    test_cfg.results_dir.mkdir(parents=True, exist_ok=True)
    (test_cfg.results_dir / "timings.json").write_text(json.dumps({"notebooks": {nb04.name: {
        "cells": cells, "digest": settings_digest(test_cfg), "s": 200.0}}}))
    lines = optional_lines(test_cfg)
    assert lines[0].startswith("optional parts (`run --skip-optional` leaves them out)")
    assert "  04 Optional: vLLM's router as the front door: 20 s in the last runs here" in lines
    assert (f"  04 Optional: the third way, one model across both nodes: {10 * len(split)} s "
            "in the last runs here") in lines
    assert ("  01 Optional: two switches, chunked prefill and prefix caching: not run here yet"
            in lines)


def test_04s_first_eta_is_a_lower_bound_naming_what_nothing_measured_yet(test_cfg, tmp_path):
    """Before prefill/decode or the split model ever ran here, 04's forecast cannot know
    their first start or the all-reduces' latency: its ETA says "at least" and names them;
    once they were measured (a P/D start and a split instance timed), it is "about"."""
    after_01(test_cfg, tmp_path)
    p04, _ = book(tmp_path, "04_x.ipynb", {
        "s": 'served = session.start("disaggregated")',
        "w": "result = lab.run_sweep(cfg, served)",
        "t": "tp = lab.start_tensor_parallel(cfg, session)",
        "ts": "if tp:\n    tp_result = lab.run_sweep(cfg, tp)"})
    eta = notebook_eta(test_cfg, p04, series="s")
    assert eta.unmeasured == ["the first prefill/decode start (its handshake, each pair's "
                              "warm-up)", "the split model's first start",
                              "the split model's all-reduce latency (its sweeps)"]
    assert eta.line().startswith(f"ETA at least {eta.seconds:.0f} s (")
    assert "more by what it does not know until this run measures it" in eta.line()
    starts(test_cfg, "spark-01", ("prefill", 30.0, False, "2026-11-28"), ("tp", 25.0, False,
                                                                           "2026-11-28"))
    timed = TimedProfile(requests=3, prompt_tokens=64, ttft_ms=40.0, step_ms=5.0)
    fc = Forecast(architecture="tensor-parallel", made_at="t", sources={}, rows=[], timed=timed)
    write_results(test_cfg, "tp", model("tp", {
        "topology": "tensor-parallel", "instances": [], "mixed": None, "sweep": sweep_dict(),
        "ranks": 2, "forecast": fc.model_dump(), "same_output": []}), software={}, hardware={})
    again = notebook_eta(test_cfg, p04, series="s")
    assert again.unmeasured == [] and again.line().startswith("ETA about ")
