"""Predict first: the attendee's guesses are stored per notebook and shown in 05 beside
the lab's forecast and the measurement, with whose number was closer."""

from __future__ import annotations

import pytest

from lab_utils.errors import LabError
from lab_utils.results import write_results
from lab_utils.results.forecast import Forecast
from lab_utils.results.guesses import ASKED, guess, guesses_frame, read_guesses

from support.payloads import baseline_dict, model, sweep_dict


def write_01(cfg, tps_top: float, tpot_c1: float, forecast_tps: float) -> None:
    levels = cfg.workload.concurrency
    combined = [{"mode": "concurrency", "value": float(c), "valid": True, "repeats": 1,
                 "output_throughput": tps_top if c == max(levels) else 100.0,
                 "median_tpot_ms": tpot_c1 if c == min(levels) else 9.0} for c in levels]
    payload = model("01", baseline_dict(sweep_dict(combined=combined)))
    fc = Forecast(architecture="baseline", made_at="2026-11-26T00:00:00", sources={},
                  rows=[{"workload": "standard", "mode": "concurrency", "value": float(c),
                         "output_throughput": forecast_tps, "median_tpot_ms": 2.0}
                        for c in levels])
    write_results(cfg, "01", payload.model_copy(update={"forecast": fc}), software={},
                  hardware={})


def test_guesses_are_stored_per_notebook_and_checked(test_cfg, capsys):
    assert guess(test_cfg, "01", throughput_top=500, tpot_c1=None) is None  # no output value
    assert "your guess: output throughput" in capsys.readouterr().out
    guess(test_cfg, "04", ttft_c1=30, itl_p99_mixed=12)
    stored = read_guesses(test_cfg)
    assert stored["01"]["throughput_top"] == 500.0 and "tpot_c1" not in stored["01"]
    assert stored["04"]["itl_p99_mixed"] == 12.0
    guess(test_cfg, "01", throughput_top=None, tpot_c1=None)  # run again: replaced, not merged
    assert "throughput_top" not in read_guesses(test_cfg)["01"]
    assert "no guess entered" in capsys.readouterr().out
    with pytest.raises(LabError, match="asks for throughput_top, tpot_c1, not ttft"):
        guess(test_cfg, "01", ttft=3)
    with pytest.raises(LabError, match="positive number"):
        guess(test_cfg, "03", throughput_top=-1)
    with pytest.raises(LabError, match="asks for no guess"):
        guess(test_cfg, "02", x=1)
    assert set(ASKED) == {"01", "03", "04"}


@pytest.mark.parametrize("mine, closer", [(950, "you"), (300, "the forecast")])
def test_05_puts_you_beside_the_forecast_and_the_measurement(test_cfg, mine, closer):
    write_01(test_cfg, tps_top=1000.0, tpot_c1=2.5, forecast_tps=700.0)
    guess(test_cfg, "01", throughput_top=mine, tpot_c1=None)
    frame = guesses_frame(test_cfg)
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row["you"], row["the lab's forecast"], row["measured"]) == (
        f"{mine:,}", "700", "1,000")
    assert row["closer"] == closer
    assert f"concurrency {max(test_cfg.workload.concurrency)}" in row["what"]


def test_no_guess_in_the_series_is_one_line(test_cfg, capsys):
    assert guesses_frame(test_cfg) is None
    assert "no guesses were entered" in capsys.readouterr().out
    (test_cfg.results_dir).mkdir(parents=True, exist_ok=True)
    (test_cfg.results_dir / "guesses.json").write_text("{ not json")
    with pytest.raises(LabError, match="delete it"):
        guesses_frame(test_cfg)


def test_the_guess_cell_prints_what_earlier_notebooks_measured(test_cfg, capsys):
    """03's guess of the top throughput leans on 01's: the cell prints 01's figure there;
    01's own guess has nothing earlier to print."""
    write_01(test_cfg, tps_top=1000.0, tpot_c1=2.5, forecast_tps=700.0)
    guess(test_cfg, "03", throughput_top=None, itl_p99_mixed=None)
    out = capsys.readouterr().out
    top = max(test_cfg.workload.concurrency)
    assert (f"measured so far, output throughput (tok/s) at the sweep at concurrency {top}: "
            "01's single instance 1,000") in out
    guess(test_cfg, "01", throughput_top=None, tpot_c1=None)
    assert "measured so far" not in capsys.readouterr().out
