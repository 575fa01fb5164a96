"""Tables the notebooks show: the cluster's nodes and addresses, who connects to what,
and the checklist with its statuses coloured. pandas is imported only when called."""

from __future__ import annotations

from lab_utils.checks.frame import ChecklistReport
from lab_utils.config import LabConfig

STATUS_COLOURS = {"pass": "#d9f2d9", "warn": "#fff2cc", "fail": "#f8d0d0", "n/a": "#eeeeee"}


def nodes_frame(cfg: LabConfig):
    import pandas as pd

    rows = [{"node": name, "roles": ", ".join(n.roles), "reached by": n.connection,
             "LAN (HTTP)": n.lan_address, "data plane (NIXL)": n.data_address,
             "UCX devices": n.data_netdev or "-"} for name, n in cfg.nodes.items()]
    return pd.DataFrame(rows).set_index("node")


def connections_frame(cfg: LabConfig):
    import pandas as pd

    from lab_utils.checks.network import connections

    return pd.DataFrame([{"from": c.src, "to": c.dst, "address": c.target, "for": c.what}
                         for c in connections(cfg)])


def checklist_view(report: ChecklistReport):
    """The checklist as a styled table (a plain DataFrame where styling is unavailable)."""
    frame = report.to_frame().fillna("")
    try:
        return frame.style.apply(
            lambda row: [f"background-color: {STATUS_COLOURS[row['status']]}"] * len(row), axis=1)
    except ImportError:  # pandas' Styler needs jinja2
        return frame
