"""A pair's card for the workshop: one page, from the config alone, that a facilitator
prints and hands to the two people at a cluster (`python -m lab_utils card`).

It says where the notebooks are opened, which machine is which, where each instance of
each topology will listen, where the secrets live (never the secrets themselves), and the
commands that get a stuck pair going again, with this pair's config in them. It connects
to nothing and starts nothing.
"""

from __future__ import annotations

from lab_utils.config import LabConfig, known_secrets, scrub
from lab_utils.config.topology import TOPOLOGIES

NOTEBOOKS = ("00 environment", "01 one instance", "02 KV transfer", "03 replicas",
             "04 prefill/decode", "05 report")


def _where_secret(cfg: LabConfig, path: str | None, what: str) -> str:
    if not path:
        return f"{what}: none set"
    return f"{what}: in {cfg.resolve_path(path)} on the notebook host (mode 600; not printed here)"


def card_lines(cfg: LabConfig) -> list[str]:
    """The card as lines of text, at most 80 characters wide where the config allows."""
    conf = cfg.source_name
    host = cfg.notebook_host()
    lines = [f"spark-disagg-lab · pair card · profile {cfg.profile}",
             f"{cfg.description or ''}".strip(), ""]
    if host is None:
        lines.append("Notebooks: no node of this config is the notebook host (connection "
                     "\"local\"); run `make jupyter` where the notebooks run.")
    else:
        address = cfg.nodes[host].lan_address
        lines += [f"Notebooks: http://{address}:{cfg.jupyter.port}/lab?token=...",
                  f"  on {host}; `make jupyter` there prints the whole URL with a fresh token",
                  "  at each start: token ________________________________",
                  "  anyone with that URL can run code on the host: keep it at this table"]
    lines += ["", "Machines:"]
    for name, node in cfg.nodes.items():
        reach = ("this machine" if node.connection == "local" or node.ssh is None else
                 f"ssh {node.ssh.user}@{node.ssh.host}" + (f":{node.ssh.port}"
                                                          if node.ssh.port != 22 else ""))
        data = "" if node.data_address == node.lan_address else f", data {node.data_address}"
        lines.append(f"  {name:12s} {', '.join(node.roles):18s} {reach}; LAN {node.lan_address}{data}")
    lines += ["", "Where things listen once a notebook starts them:",
              f"  front door (proxy, {cfg.proxy.kind}) on {cfg.proxy.node}: "
              f"http://{cfg.nodes[cfg.proxy.node].lan_address}:{cfg.proxy.port}"]
    for topology in TOPOLOGIES:
        found = cfg.instances(topology)
        if found:
            spots = ", ".join(f"{s.name} {cfg.nodes[s.node].lan_address}:{s.port}"
                              if not s.headless else f"{s.name} on {s.node} (no HTTP)"
                              for s in found)
            lines.append(f"  {topology}: {spots}")
    lines += ["  " + _where_secret(cfg, cfg.proxy.api_key_file, "front door's API key"),
              "  " + _where_secret(cfg, cfg.vllm.api_key_file, "instances' API key")
              + ("" if cfg.vllm.api_key_file or not cfg.proxy.api_key_file
                 else " (they use the front door's)"),
              "", "Notebooks in order: " + ", ".join(NOTEBOOKS),
              f"Results: {cfg.results_dir}", ""]
    run = f"python -m lab_utils {{}} --config {conf}"
    lines += ["When something goes wrong (in this order):",
              f"  what runs:        {run.format('status')}",
              f"  stop all of it:   {run.format('cleanup')}",
              f"  check again:      {run.format('check')}",
              "  reset the pair:   cleanup, restart the notebook's kernel, then either",
              f"    re-run from notebook NN: {run.format('run --from NN')}",
              f"    or continue from the reference results: {run.format('reference DIR')}",
              "  no cluster at all: `make lab` runs the series on any laptop (CPU, tiny model)",
              "  triage: docs/TRIAGE.md (while serving), docs/FACILITATOR.md (the checklist)"]
    return lines


def print_card(cfg: LabConfig) -> None:
    """The card on stdout, with any secret value the config can reach masked (a key pasted
    into a path or the description by mistake)."""
    print(scrub("\n".join(card_lines(cfg)), known_secrets(cfg)))
