"""A pair's card for the workshop: one page, from the config alone, that a facilitator
prints and hands to the two people at a cluster (`python -m lab_utils card`).

It says how to open the notebooks (the URL with the pair's token, which stays the same
across restarts: `config.jupyter_token`), who drives and when the partners swap, the
checkpoints of the day (`agenda.checkpoints`), which machine is which, where each instance
of each topology will listen, where the secrets live (never the secrets themselves), and
the commands that get a stuck pair going again, as typed on the pair's notebook host in its
checkout. A config with a value still to fill in (REPLACE) or a notebook address no laptop
can reach is refused. It connects to nothing and starts nothing.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from lab_utils.config import LabConfig, known_secrets, scrub
from lab_utils.config.topology import TOPOLOGIES
from lab_utils.errors import LabError
from lab_utils.notebook.agenda import checkpoints

NOTEBOOKS = ("00 environment", "01 one instance", "02 KV transfer", "03 replicas",
             "04 prefill/decode", "05 report")
CHECKOUT = "~/spark-disagg-lab"  # where staging clones the lab on each notebook host
REFERENCE = "~/reference-results"  # where staging copies the reference results


def _on_host(path: str, checkout: str) -> str:
    """A path of the config as it is on the notebook host (relative: from its checkout)."""
    return path if path.startswith(("/", "~")) else f"{checkout}/{path}"


def _where_secret(path: str | None, what: str, checkout: str) -> str:
    if not path:
        return f"{what}: none set"
    return f"{what}: in {_on_host(path, checkout)} on the notebook host (mode 600; not shown)"


def _unfilled(value: Any, where: str = "") -> list[str]:
    """Every value of the config still marked REPLACE, with where it is."""
    if isinstance(value, dict):
        return [u for k, v in value.items() for u in _unfilled(v, f"{where}.{k}".lstrip("."))]
    if isinstance(value, list):
        return [u for i, v in enumerate(value) for u in _unfilled(v, f"{where}[{i}]")]
    return [f"{where} = {value!r}"] if isinstance(value, str) and "REPLACE" in value else []


def card_problems(cfg: LabConfig) -> list[str]:
    """Why the card of `cfg` would not work at the pair's table ([]: it would)."""
    out = [f"still to fill in: {u}" for u in _unfilled(cfg.model_dump())]
    host = cfg.notebook_host()
    if host is not None and not cfg.jupyter.public_url:
        address = ipaddress.ip_address(cfg.nodes[host].lan_address)
        if address.is_loopback or address.is_unspecified or address.is_link_local:
            out.append(f"the notebooks' address {address} (nodes.{host}.lan_address) is not "
                       "reachable from an attendee's laptop: set the host's LAN address, or "
                       "jupyter.public_url to where the venue's network reaches it")
    return out


def require_card(cfg: LabConfig) -> None:
    """LabError listing `card_problems`, if there are any."""
    problems = card_problems(cfg)
    if problems:
        raise LabError(f"no card for profile {cfg.profile} ({cfg.source_name}): "
                       + "; ".join(problems))


def card_lines(cfg: LabConfig, token: str, checkout: str = CHECKOUT,
               reference: str = REFERENCE) -> list[str]:
    """The card as lines of text, at most 80 characters wide where the config allows.
    `token`: the pair's JupyterLab token; `checkout`: the lab's checkout on the pair's
    notebook host (the pair's config is its environment_config.json); `reference`: where
    the reference results are on that host. LabError listing `card_problems` if any."""
    require_card(cfg)
    host = cfg.notebook_host()
    lines = [f"spark-disagg-lab · pair card · profile {cfg.profile}",
             f"{cfg.description or ''}".strip(), ""]
    if host is None:
        lines.append("Notebooks: no node of this config is the notebook host (connection "
                     "\"local\"); run `make jupyter` where the notebooks run.")
    else:
        base = (cfg.jupyter.public_url or
                f"http://{cfg.nodes[host].lan_address}:{cfg.jupyter.port}").rstrip("/")
        lines += ["Open the notebooks:", f"  {base}/lab?token={token}",
                  f"  JupyterLab on {host}; the address stays the same when it restarts.",
                  "  Anyone with it can run code on that machine: keep it at this table."]
    lines += ["", "Who drives: one of you runs the cells; the other reads each forecast aloud",
              "and says what they predict before the cell runs. Swap at the break.",
              "Checkpoints (time from the start of the day):"]
    lines += [f"  {at:>5}  {what}" for at, what in checkpoints()]
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
    lines += ["  " + _where_secret(cfg.proxy.api_key_file, "front door's API key", checkout),
              "  " + _where_secret(cfg.vllm.api_key_file, "instances' API key", checkout)
              + ("" if cfg.vllm.api_key_file or not cfg.proxy.api_key_file
                 else " (they use the front door's)"),
              "", "Notebooks in order: " + ", ".join(NOTEBOOKS[:3]) + ",",
              "  " + ", ".join(NOTEBOOKS[3:]),
              f"Results: {_on_host(cfg.results_root, checkout)}/{cfg.profile} on "
              f"{host or 'the notebook host'}", ""]
    run = ".venv/bin/python -m lab_utils {}"
    lines += [f"When something goes wrong: in a terminal on {host or 'the notebook host'}",
              f"(JupyterLab: File > New > Terminal), `cd {checkout}`, then, in order:",
              f"  what runs:        {run.format('status')}",
              f"  stop all of it:   {run.format('cleanup')}",
              f"  check again:      {run.format('check')}",
              "  reset the pair:   cleanup, restart the notebook's kernel, then either",
              f"    re-run from notebook NN: {run.format('run --from NN')}",
              "    or continue from the reference results:",
              f"      {run.format('reference ' + reference)}",
              "  behind time: leave out the cells under headings that start with \"Optional:\"",
              "  no cluster at all: `make lab` runs the series on any laptop (CPU, tiny model)",
              "  triage: docs/TRIAGE.md (while serving), docs/FACILITATOR.md (the checklist)"]
    return lines


def print_card(cfg: LabConfig, token: str, checkout: str = CHECKOUT,
               reference: str = REFERENCE) -> None:
    """The card on stdout, with any secret value the config can reach masked (a key pasted
    into a path or the description by mistake); the JupyterLab token is the pair's own and
    shown."""
    print(scrub("\n".join(card_lines(cfg, token, checkout, reference)), known_secrets(cfg)))
