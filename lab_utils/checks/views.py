"""Tables the notebooks show: the cluster's nodes and addresses, who connects to what,
and the checklist with its statuses coloured, every cell whole (`util.tables.whole_tables`:
00 shows them before anything else sets that). pandas is imported only when called."""

from __future__ import annotations

from lab_utils.checks.frame import ChecklistReport
from lab_utils.checks.network import connections
from lab_utils.config import LabConfig
from lab_utils.util.tables import whole_tables

STATUS_COLOURS = {"pass": "#d9f2d9", "warn": "#fff2cc", "fail": "#f8d0d0", "n/a": "#eeeeee"}


def nodes_frame(cfg: LabConfig):
    import pandas as pd

    whole_tables()
    rows = [{"node": name, "roles": ", ".join(n.roles), "reached by": n.connection,
             "LAN (HTTP)": n.lan_address, "data plane (NIXL)": n.data_address,
             "UCX devices": n.data_netdev or "-"} for name, n in cfg.nodes.items()]
    return pd.DataFrame(rows).set_index("node")


def connections_frame(cfg: LabConfig):
    import pandas as pd

    whole_tables()
    return pd.DataFrame([{"from": c.src, "to": c.dst, "address": c.target, "for": c.what}
                         for c in connections(cfg)])


STATUS_ORDER = {"fail": 0, "warn": 1, "pass": 2, "n/a": 3}


def tally(report: ChecklistReport) -> str:
    """One line: how many checks ended how, failures first."""
    c = report.counts
    verdict = "NOT blessed: fix the failures first" if c["fail"] else "no failure"
    return (f"{len(report.results)} results: {c['fail']} fail, {c['warn']} warn, "
            f"{c['pass']} pass, {c['n/a']} n/a ({verdict})")


def checklist_frame(report: ChecklistReport, show_na: bool = False):
    """Fails, then warns, then passes (each in node order); the n/a results collapsed into
    one row with their count and names, unless `show_na`."""
    import pandas as pd

    frame = report.to_frame().fillna("")
    frame = frame.iloc[sorted(range(len(frame)),
                              key=lambda i: (STATUS_ORDER.get(frame["status"].iloc[i], 9), i))]
    if not show_na:
        na = frame[frame["status"] == "n/a"]
        frame = frame[frame["status"] != "n/a"]
        if len(na):
            names = ", ".join(dict.fromkeys(f"{r.check} ({r.node})" for r in na.itertuples()))
            frame = pd.concat([frame, pd.DataFrame([{
                "check": f"{len(na)} n/a", "node": "", "status": "n/a",
                "summary": f"not applicable here: {names}", "evidence": "", "fix": ""}])])
    return frame.reset_index(drop=True)


def checklist_view(report: ChecklistReport, show_na: bool = False):
    """`checklist_frame` styled by status (a plain DataFrame where styling is unavailable)."""
    frame = checklist_frame(report, show_na)
    try:
        return frame.style.apply(
            lambda row: [f"background-color: {STATUS_COLOURS[row['status']]}"] * len(row), axis=1)
    except ImportError:  # pandas' Styler needs jinja2
        return frame
