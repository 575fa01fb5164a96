"""The lab's command line: `python -m lab_utils COMMAND [--config F] ...`.

Commands: `check` the environment (the bring-up checklist), `report` (the benchmark report), `serve` a topology (vLLM instances and the proxy; `--dry-run` prints the plan), `proxy`, `bench`, `status`, `cleanup`, `deploy` (the lab's code to the
SSH nodes), `model fetch` (the model onto every serving node), `tiny-model`, `demo` (the
prefill/decode proof of transfer on the configured profile), `run` (execute the
notebooks headless) and `lab` (the main job: the notebooks if there are any, else the
demo). A command that acts on the nodes builds one `Cluster` (one connection per node) and
closes it when done. Errors the user can fix are printed as one message, without a traceback.

Here: the parser (every command's arguments, so that `--help` loads nothing heavy), the
argument types and `main`; each command's code is the module of its name in this package
(`serve`, `bench`, ... `tiny_model`), imported when that command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from lab_utils.cli.args import base_url, gib, levels, notebook_number
from lab_utils.config import TOPOLOGIES, known_secrets, load_config, scrub, secrets_in
from lab_utils.errors import LabError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab_utils", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--config", help="config file (default: $LAB_CONFIG, else "
                        "environment_config.json, else configs/local-cpu.json)")
        sp.set_defaults(module=name.replace("-", "_"))
        return sp

    sp = cmd("serve", "start a topology's vLLM instances and the proxy in front of "
             "them, and wait until all are healthy")
    sp.add_argument("--topology", choices=TOPOLOGIES, required=True)
    sp.add_argument("--no-proxy", action="store_true", help="start the vLLM instances only")
    sp.add_argument("--dry-run", action="store_true", help="print the plan (every instance's "
                    "node, command, environment, ports, memory per node) and start nothing; "
                    "exit 1 if it does not fit")
    sp.add_argument("--mem-total-gib", type=gib, help="with --dry-run: the nodes' MemTotal "
                    "in GiB instead of reading /proc/meminfo on them")
    sp.add_argument("--offline", action="store_true", help="with --dry-run: contact no node")
    sp.add_argument("--model", help="with --dry-run: plan this Hugging Face model instead of the "
                    "profile's (its config.json from this host's cache, else the published one "
                    "the lab knows, e.g. Qwen/Qwen3-235B-A22B-GPTQ-Int4)")
    sp = cmd("proxy", "run the front door in the foreground: the lab proxy, or "
             "vllm-router with proxy.kind \"vllm-router\" (serve starts it for you)")
    sp.add_argument("--mode", choices=TOPOLOGIES, required=True)
    sp.add_argument("--kind", choices=("lab", "vllm-router"), help="instead of proxy.kind")
    sp.add_argument("--policy", choices=("round_robin", "least_outstanding"),
                    help="instead of topology.replicated.policy")
    cmd("report", "write the benchmark report (report.html, report.md, plots) "
        "from the results of notebooks 00-04")
    sp = cmd("check", "the bring-up checklist: every check on every node it concerns, "
             "pass/warn/fail/n/a with evidence and the fix; exit 1 on any fail")
    sp.add_argument("--json", action="store_true", help="print the results as JSON")
    cmd("status", "list the processes recorded for the profile")
    sp = cmd("audit", "check every claim the notebooks and the report saved "
             "(claims.json) against the results files, and list the result sentences of the "
             "executed notebooks and the report that no claim backs; exit 1 on any")
    sp.add_argument("results_dir", nargs="?", help="a results directory (default: the profile's)")
    sp = cmd("bench", "measure a serving endpoint (streaming completions): sweep "
             "concurrency levels and/or Poisson request rates; defaults from the config's workload")
    sp.add_argument("--url", required=True, type=base_url, help="base URL, e.g. http://127.0.0.4:8000")
    sp.add_argument("--api-key-file", help="file (mode 600) holding the endpoint's API key, "
                    "sent as a bearer token (default: $OPENAI_API_KEY, if set)")
    sp.add_argument("--model", help="served model name (default: the config's)")
    sp.add_argument("--out", required=True, help="results JSON to write")
    sp.add_argument("--concurrency", type=levels, help="comma-separated levels, e.g. 1,4,16")
    sp.add_argument("--rate", type=levels, help="comma-separated Poisson request rates (req/s)")
    sp.add_argument("--burstiness", type=float, help="gamma shape of arrivals (1: Poisson)")
    for name in ("input-len", "output-len", "num-prompts", "warmup", "repeats", "seed"):
        sp.add_argument(f"--{name}", type=int)
    sp.add_argument("--duration", type=float, help="stop starting requests after this many s")
    sp.add_argument("--mixed", action="store_true", help="one long prompt every mixed_long_every")
    sp.add_argument("--range-ratio", type=float, help="draw each request's input and output "
                    "length from [L*(1-r), L*(1+r)], as vllm bench serve's --random-range-ratio")
    sp.add_argument("--dataset", help="prompts from a file: vllm bench serve's custom JSONL "
                    "(prompt, output_tokens) or ShareGPT JSON (docs/MEASURING.md)")
    sp.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    sp.add_argument("--tokenizer", help="local model dir with tokenizer.json (default: "
                    "the server's /tokenize)")
    cmd("cleanup", "stop everything recorded for the profile, on every node")
    sp = cmd("deploy", "copy the lab's code to the SSH nodes and check their Python")
    sp.add_argument("--force", action="store_true", help="copy even if the node's copy is current")
    sp = cmd("model", "make the model present, same snapshot, on every serving node")
    sp.add_argument("action", choices=["fetch"])
    sp = sub.add_parser("tiny-model", help="generate the rehearsal's tiny Llama model")
    sp.add_argument("out_dir")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--force", action="store_true", help="regenerate even if up to date")
    sp.set_defaults(module="tiny_model")
    demo = cmd("demo", "prefill on one instance, decode on another, prove the KV moved")
    run = cmd("run", "execute the notebooks headless, saving executed copies")
    cmd("eta", "predict how long notebooks 01, 03 and 04 measure with this config's "
        "workload (the forecast model: 01's profile, else published GB10 figures)")
    sp = cmd("reference", "load another run's results (a results directory, "
             "e.g. results/local-cpu or a pair's from the day before): for each notebook this "
             "profile has not run, its results stand in, labelled as the reference's; all are "
             "kept for the notebooks' 'yours vs reference'")
    sp.add_argument("source", help="a results directory holding *_metrics.json files")
    sp.add_argument("--compare-only", action="store_true", help="keep them for comparison "
                    "only; stand in for nothing")
    sp = cmd("jupyter", "JupyterLab on the notebook host's LAN address and "
             "jupyter.port, with a token; prints the URL to open (Ctrl-C stops it)")
    sp.add_argument("--notebooks-dir", default=None, help=argparse.SUPPRESS)
    sp = cmd("card", "a one-page card for the pair each config describes (the "
             "notebooks' URL, the machines, where each instance listens, where the keys are, "
             "the commands that get a stuck pair going again); connects to nothing")
    sp.add_argument("configs", nargs="*", help="one config per pair (a page each); "
                    "default: --config's")
    sp.add_argument("--checkout", help="the lab's checkout on each pair's notebook host, its "
                    "config there environment_config.json (default: ~/spark-disagg-lab)")
    sp.add_argument("--reference", help="where the reference results are on each pair's "
                    "notebook host (default: ~/reference-results)")
    sp = cmd("timetable", "the workshop day's timetable from a dress run's results "
             "directory: each slot beside the notebook's measured run, what is left to read, "
             "the slots to rebuild, the measured start-ups")
    sp.add_argument("results_dir", help="the dress run's results/<profile> directory")
    cmd("triage", "the triage sheet for failures while serving (docs/TRIAGE.md), "
        "from the failures the lab recognises in logs (the same for every config)")
    lab = cmd("lab", "the main job: run the notebooks (or the demo while there are none)")
    for sp in (demo, lab):
        sp.add_argument("--prompts", type=int, default=1, help="fresh prompts to prove transfer on")
        sp.add_argument("--max-tokens", type=int, default=16, help="tokens to generate per prompt")
    for sp in (run, lab):
        sp.add_argument("--from", dest="start", default=None, type=notebook_number,
                        help="first notebook number, e.g. 00")
        sp.add_argument("--to", dest="stop", default=None, type=notebook_number,
                        help="last notebook number, e.g. 04")
        sp.add_argument("--notebooks-dir", default=None, help=argparse.SUPPRESS)
        sp.add_argument("--skip-optional", action="store_true",
                        help="leave out the optional parts (01's two switches, 04's router and "
                             "split-model sections); `eta` says what each saves")
    return p


def _masked(message: str, args) -> str:
    """An error message with every secret the profile can reach masked (when the profile
    loads), and always the secret environment variables and key-shaped words."""

    secrets = secrets_in(None)
    with contextlib.suppress(Exception):  # the error may be the profile's own
        secrets += known_secrets(load_config(getattr(args, "config", None)))
    return scrub(message, secrets)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # the command's module, and what it imports, loads only now (`--help` stays light)
        return importlib.import_module(f"lab_utils.cli.{args.module}").run(args)
    except LabError as e:
        print(f"error: {_masked(str(e), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; what this command started has been stopped", file=sys.stderr)
        return 130
