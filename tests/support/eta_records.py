"""Results and calibration records the ETA forecasts from: notebook 01's engine profile,
02's probe, and measured starts per node."""

from __future__ import annotations

from lab_utils.forecast.curves import point
from lab_utils.results import calibration, write_results
from lab_utils.results.calibration import Calibration
from lab_utils.results.forecast import DecodeLine, EngineProfile

from support.payloads import baseline_dict, kv_dict, model


def write_01_02(cfg) -> None:
    """Notebook 01's results with an engine profile and 02's with a probe: what the ETA
    forecasts from."""
    base = baseline_dict()
    curve = lambda ys: [point(x, [y * 0.9, y, y * 1.2]) for x, y in ys]  # noqa: E731
    base["profile"] = EngineProfile(
        prefill=curve([(32, 6.0), (128, 7.0), (1024, 33.0)]),
        decode=[DecodeLine(context=152, points=curve([(1, 1.5), (2, 1.6), (4, 1.8)])),
                DecodeLine(context=1048, points=curve([(1, 1.6), (2, 1.8), (4, 2.1)]))],
        hop=point(128, [0.8, 1.0, 1.3]), token_budget=2048, device="cpu", elapsed_s=3.0,
        active_cores=1.9, host_cores=2).model_dump()
    write_results(cfg, "01", model("01", base), software={}, hardware={})
    rows = [{"seg_type": "DRAM", "op": "READ", "bytes": b, "iterations": 20,
             "median_us": b / 5e3, "p99_us": b / 4e3} for b in (262144, 1 << 20, 1 << 22)]
    write_results(cfg, "02", model("02", kv_dict(probe_rows=rows)), software={}, hardware={})


def starts(cfg, node: str, *runs: tuple[str, float, bool, str]) -> None:
    """A node's record holding these starts: (role, seconds, first, date)."""
    cal = calibration.load(cfg, node) or Calibration(node, cfg.profile, cfg.vllm.device)
    cal.starts += [{"instance": f"{role}-0", "role": role, "s": s, "first": first,
                    "at": f"{day}T10:00:00Z"} for role, s, first, day in runs]
    calibration.save(cfg, cal)
