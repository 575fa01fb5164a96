"""The lab's command line: `python -m lab_utils COMMAND [--config F] ...`.

Commands: `check` the environment (the bring-up checklist), `report` (the benchmark report), `serve` a topology (vLLM instances and the proxy; `--dry-run` prints the plan), `proxy`, `bench`, `status`, `cleanup`, `deploy` (the lab's code to the
SSH nodes), `model fetch` (the model onto every serving node), `tiny-model`, `demo` (the
prefill/decode proof of transfer on the configured profile), `run` (execute the
notebooks headless) and `lab` (the main job: the notebooks if there are any, else the
demo). A command that acts on the nodes builds one `Cluster` (one connection per node) and
closes it when done. Errors the user can fix are printed as one message, without a traceback.

Over 400 lines for now: each command's parser and its short function side by side; one
module per command is the next step (the commands' imports wait inside their functions so
that `--help` does not load vLLM or pandas).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from lab_utils.config import TOPOLOGIES, load_config, with_proxy
from lab_utils.errors import LabError


def _gib(text: str) -> float:
    """A memory size in GiB a node could have (finite, above 0, at most 64 TiB)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 65536:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a memory size in GiB (0 to 65536)")
    return value

def _notebook_number(text: str) -> str:
    """A notebook's number as its file names start (`3` is `03`); anything else refused."""
    if not text.isdigit() or len(text) > 2:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a notebook number: give 00 to 05")
    return text.zfill(2)

def _cmd_serve(args) -> int:
    from lab_utils.cluster import Cluster
    from lab_utils.notebook import kv_buffer_device
    from lab_utils.serve import serve

    cfg = load_config(args.config)
    if args.model and not args.dry_run:
        raise LabError("--model is for --dry-run (the plan of another model); to serve it, "
                       "set model.name in the profile")
    if args.model:
        from lab_utils.config import with_model

        cfg = with_model(cfg, args.model)
    if args.dry_run:
        from lab_utils.serve import make_plan

        total = int(args.mem_total_gib * 2**30) if args.mem_total_gib else None
        with Cluster(cfg) as cluster:
            plan = make_plan(cluster, args.topology, kv_buffer_device=kv_buffer_device(cfg),
                             mem_total=total, read_nodes=not args.offline)
        print(plan.text())
        return 0 if plan.fits else 1
    with Cluster(cfg) as cluster:
        records = serve(cluster, args.topology, with_proxy=not args.no_proxy,
                        kv_buffer_device=kv_buffer_device(cfg))
    for rec in records:
        print(f"{rec.name:<12} {rec.node:<12} {rec.url or '(headless rank)'}  pid {rec.pid}  "
              f"log {rec.log_path}")
    print(f"stop with: python -m lab_utils cleanup --config {cfg.source}")
    return 0


def _cmd_proxy(args) -> int:
    cfg = load_config(args.config)
    kind = args.kind if args.kind and args.kind != cfg.proxy.kind else None
    policy = args.policy if args.policy and args.policy != cfg.topology.replicated.policy else None
    if kind or policy:
        cfg = with_proxy(cfg, kind=kind, policy=policy)
    if cfg.proxy.kind == "vllm-router":
        from lab_utils.serve import router

        router.run(cfg, args.mode)  # replaces this process
    from lab_utils.serve import proxy

    proxy.run(cfg, args.mode)
    return 0


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(x) for x in text.split(",") if x.strip()]


def _levels(text: str) -> str:
    """A comma-separated list of positive finite numbers (checked; kept as text)."""
    try:
        ok = all(0 < v < float("inf") for v in _floats(text) or [float("nan")])
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a comma-separated list of "
                                         "positive numbers, e.g. 1,4,16")
    return text


def _base_url(text: str) -> str:
    """An http(s) base URL httpx can reach (scheme, host, a valid port)."""
    import httpx

    try:
        url = httpx.URL(text)
        ok = url.scheme in ("http", "https") and bool(url.host)
    except (httpx.InvalidURL, ValueError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not an http:// or https:// base URL, "
                                         "e.g. http://127.0.0.4:8000")
    return text


def _cmd_bench(args) -> int:
    from lab_utils.config import read_secret_file
    from lab_utils.measure import sweep, workload
    from lab_utils.results import COMPARED, write_envelope

    cfg = load_config(args.config)
    overrides = {k: v for k, v in {
        "input_len": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
        "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
        "burstiness": args.burstiness, "duration_s": args.duration, "chat": args.chat or None,
        "concurrency": [int(c) for c in _floats(args.concurrency) or []] if args.concurrency else None,
        "request_rates": _floats(args.rate),
    }.items() if v is not None}
    if args.rate and not args.concurrency:
        overrides["concurrency"] = []
    w = cfg.workload.model_copy(update=overrides)
    model = args.model or cfg.model.name
    key = (read_secret_file(cfg, str(Path(args.api_key_file).resolve()), "API key (--api-key-file)")
           if args.api_key_file else os.environ.get("OPENAI_API_KEY"))
    import httpx

    tok, detok = (workload.local_tokenizer(args.tokenizer) if args.tokenizer
                  else workload.server_tokenizer(args.url, model, key))
    try:
        result = sweep(args.url, model,
                       lambda n, seed: workload.build_requests(w, n, tok, detok, mixed=args.mixed,
                                                               seed=seed), w,
                       mixed=args.mixed, api_key=key)
    except httpx.HTTPError as e:  # the tokenizer's calls: before any measurement
        raise LabError(f"{args.url} did not answer ({type(e).__name__}: {e}): is the server up "
                       "(python -m lab_utils status), and is this its address and port?") from None
    out = write_envelope(cfg, args.out, "benchmark", "cli", result.model_dump())
    width = {m.key: max(len(m.label), 8) + 2 for m in COMPARED}
    print(f"{'point':<18}" + "".join(f"{m.label:>{width[m.key]}}" for m in COMPARED) + "  valid")
    print(f"{'':<18}" + "".join(f"{m.unit:>{width[m.key]}}" for m in COMPARED))
    for c in result.combined:
        print(f"{c.load:<18}"
              + "".join(f"{m.text(c.median(m), unit=False):>{width[m.key]}}" for m in COMPARED)
              + f"  {'yes' if c.valid else 'NO: see errors'}")
    print(f"written: {out}")
    return 0 if all(c.valid for c in result.combined) else 1


def _cmd_status(args) -> int:
    from lab_utils.cluster import Cluster
    from lab_utils.config import api_key
    from lab_utils.serve import healthy

    cfg = load_config(args.config)
    keys = {"proxy": api_key(cfg, "proxy"), "vllm": api_key(cfg, "vllm")}
    with Cluster(cfg) as cluster:
        from lab_utils.serve import stop_lone_ranks

        if said := stop_lone_ranks(cluster, cluster.running()):
            print(said)
        recs = cluster.running()
        if not recs:
            print(f"nothing recorded for profile {cfg.profile}")
        for rec in recs:
            alive = cluster.knows(rec.node) and cluster.node(rec.node).is_alive(rec)
            key = keys["proxy" if rec.kind == "proxy" else "vllm"]
            state = ("healthy" if rec.url and healthy(rec.url, api_key=key) else "alive") if alive else "dead"
            if not alive and cluster.knows(rec.node) and cluster.node(rec.node).stop(rec, 5.0):
                state = "dead (the processes it left running were stopped)"
            print(f"{rec.name:<12} {rec.node:<12} {rec.url or '':<28} pid {rec.pid:<8} {state}")
    return 0


def _cmd_cleanup(args) -> int:
    from lab_utils.serve import cleanup

    cfg = load_config(args.config)
    stopped = cleanup(cfg)
    print(f"profile {cfg.profile}: stopped {len(stopped)} process group(s)"
          + (f": {', '.join(stopped)}" if stopped else ""))
    return 0


def _cmd_deploy(args) -> int:
    from lab_utils.cluster import deploy

    for line in deploy(load_config(args.config), force=args.force):
        print(line)
    return 0


def _cmd_model(args) -> int:
    from lab_utils.cluster import model_fetch

    cfg = load_config(args.config)
    for node, snap in model_fetch(cfg).items():
        print(f"{node:<12} {cfg.model.name} at {cfg.model_path_on(node)}  snapshot {snap[:16]}")
    return 0


def _cmd_tiny_model(args) -> int:
    from lab_utils.cluster import tiny_model

    out = tiny_model.generate(args.out_dir, seed=args.seed, force=args.force)
    print(f"tiny model in {out} (sha256 {tiny_model.fingerprint(out)[:16]})")
    return 0


def _cmd_demo(args) -> int:
    from lab_utils.notebook import kv_buffer_device
    from lab_utils.serve import demo

    cfg = load_config(args.config)
    proofs = demo.run_demo(cfg, n_prompts=args.prompts, max_tokens=args.max_tokens,
                      kv_buffer_device=kv_buffer_device(cfg))
    return 0 if all(p.ok for p in proofs) else 1


def _cmd_check(args) -> int:
    import json

    from lab_utils.checks import run_checks

    cfg = load_config(args.config)
    report = run_checks(cfg, show_progress=not args.json)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 1 if report.failed else 0


def _cmd_report(args) -> int:
    from lab_utils.report import build_report

    paths = build_report(load_config(args.config))
    for sentence in paths.conclusions:
        print(f"- {sentence}")
    if paths.missing:
        print(f"not in the report (run them first): {', '.join(paths.missing)}")
    print(f"written: {paths.html}\n         {paths.md}\n         {len(paths.plots)} plots in "
          f"{paths.html.parent / 'plots'}")
    return 0


def _cmd_run(args) -> int:
    from lab_utils.runner import run_notebooks

    cfg = load_config(args.config)
    run_notebooks(cfg, start=args.start, stop=args.stop, notebooks_dir=args.notebooks_dir)
    print(f"results, executed notebooks and logs: {cfg.results_dir}")
    if (cfg.results_dir / "report.html").exists():
        print(f"report: {cfg.results_dir / 'report.html'} (open it in a browser)")
    return 0


def audit_false(results_dir) -> bool:
    from lab_utils.report import audit

    return bool(audit(results_dir).false)


def _cmd_audit(args) -> int:
    from lab_utils.report import audit

    found = audit(args.results_dir or load_config(args.config).results_dir)
    print("\n".join(found.lines()))
    return 0 if found.ok else 1


def _cmd_eta(args) -> int:
    from lab_utils.notebook import eta_lines, whole_notebook_lines

    cfg = load_config(args.config)
    lines = eta_lines(cfg)
    print("\n".join(lines + whole_notebook_lines(cfg)))
    return 0 if len(lines) > 1 else 1


def _cmd_reference(args) -> int:
    from lab_utils.results import load_reference

    cfg = load_config(args.config)
    for line in load_reference(cfg, args.source, fill=not args.compare_only):
        print(line)
    print(f"in {cfg.results_dir}; every notebook that reads a reference's results says so")
    return 0


def _cmd_card(args) -> int:
    from lab_utils.notebook import print_card

    sources = args.configs or [args.config]
    for i, source in enumerate(sources):
        if i:
            print("\f")  # a page break between pairs when printed
        print_card(load_config(source))
    return 0


def _cmd_triage(_args) -> int:
    from lab_utils.notebook import triage_text

    print(triage_text(), end="")
    return 0


def _cmd_jupyter(args) -> int:
    from lab_utils.runner import serve_jupyter

    return serve_jupyter(load_config(args.config), args.notebooks_dir)


def _cmd_lab(args) -> int:
    from lab_utils.runner import find_notebooks

    if find_notebooks(args.notebooks_dir):
        ran = _cmd_run(args)
        if ran == 0 and args.start is None and args.stop is None:
            print("audit: every result sentence of the run against its results files")
            args.results_dir = None
            _cmd_audit(args)  # an unbacked sentence is reported; a false claim fails the run
            return 1 if audit_false(load_config(args.config).results_dir) else 0
        return ran
    print("no notebooks yet: running the prefill/decode proof of transfer instead")
    return _cmd_demo(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab_utils", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name: str, func, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--config", help="config file (default: $LAB_CONFIG, else "
                        "environment_config.json, else configs/local-cpu.json)")
        sp.set_defaults(func=func)
        return sp

    sp = cmd("serve", _cmd_serve, "start a topology's vLLM instances and the proxy in front of "
             "them, and wait until all are healthy")
    sp.add_argument("--topology", choices=TOPOLOGIES, required=True)
    sp.add_argument("--no-proxy", action="store_true", help="start the vLLM instances only")
    sp.add_argument("--dry-run", action="store_true", help="print the plan (every instance's "
                    "node, command, environment, ports, memory per node) and start nothing; "
                    "exit 1 if it does not fit")
    sp.add_argument("--mem-total-gib", type=_gib, help="with --dry-run: the nodes' MemTotal "
                    "in GiB instead of reading /proc/meminfo on them")
    sp.add_argument("--offline", action="store_true", help="with --dry-run: contact no node")
    sp.add_argument("--model", help="with --dry-run: plan this Hugging Face model instead of the "
                    "profile's (its config.json from this host's cache, else the published one "
                    "the lab knows, e.g. Qwen/Qwen3-235B-A22B-GPTQ-Int4)")
    sp = cmd("proxy", _cmd_proxy, "run the front door in the foreground: the lab proxy, or "
             "vllm-router with proxy.kind \"vllm-router\" (serve starts it for you)")
    sp.add_argument("--mode", choices=TOPOLOGIES, required=True)
    sp.add_argument("--kind", choices=("lab", "vllm-router"), help="instead of proxy.kind")
    sp.add_argument("--policy", choices=("round_robin", "least_outstanding"),
                    help="instead of topology.replicated.policy")
    cmd("report", _cmd_report, "write the benchmark report (report.html, report.md, plots) "
        "from the results of notebooks 00-04")
    sp = cmd("check", _cmd_check, "the bring-up checklist: every check on every node it concerns, "
             "pass/warn/fail/n/a with evidence and the fix; exit 1 on any fail")
    sp.add_argument("--json", action="store_true", help="print the results as JSON")
    cmd("status", _cmd_status, "list the processes recorded for the profile")
    sp = cmd("audit", _cmd_audit, "check every claim the notebooks and the report saved "
             "(claims.json) against the results files, and list the result sentences of the "
             "executed notebooks and the report that no claim backs; exit 1 on any")
    sp.add_argument("results_dir", nargs="?", help="a results directory (default: the profile's)")
    sp = cmd("bench", _cmd_bench, "measure a serving endpoint (streaming completions): sweep "
             "concurrency levels and/or Poisson request rates; defaults from the config's workload")
    sp.add_argument("--url", required=True, type=_base_url, help="base URL, e.g. http://127.0.0.4:8000")
    sp.add_argument("--api-key-file", help="file (mode 600) holding the endpoint's API key, "
                    "sent as a bearer token (default: $OPENAI_API_KEY, if set)")
    sp.add_argument("--model", help="served model name (default: the config's)")
    sp.add_argument("--out", required=True, help="results JSON to write")
    sp.add_argument("--concurrency", type=_levels, help="comma-separated levels, e.g. 1,4,16")
    sp.add_argument("--rate", type=_levels, help="comma-separated Poisson request rates (req/s)")
    sp.add_argument("--burstiness", type=float, help="gamma shape of arrivals (1: Poisson)")
    for name in ("input-len", "output-len", "num-prompts", "warmup", "repeats", "seed"):
        sp.add_argument(f"--{name}", type=int)
    sp.add_argument("--duration", type=float, help="stop starting requests after this many s")
    sp.add_argument("--mixed", action="store_true", help="one long prompt every mixed_long_every")
    sp.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    sp.add_argument("--tokenizer", help="local model dir with tokenizer.json (default: "
                    "the server's /tokenize)")
    cmd("cleanup", _cmd_cleanup, "stop everything recorded for the profile, on every node")
    sp = cmd("deploy", _cmd_deploy, "copy the lab's code to the SSH nodes and check their Python")
    sp.add_argument("--force", action="store_true", help="copy even if the node's copy is current")
    sp = cmd("model", _cmd_model, "make the model present, same snapshot, on every serving node")
    sp.add_argument("action", choices=["fetch"])
    sp = sub.add_parser("tiny-model", help="generate the rehearsal's tiny Llama model")
    sp.add_argument("out_dir")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--force", action="store_true", help="regenerate even if up to date")
    sp.set_defaults(func=_cmd_tiny_model)
    demo = cmd("demo", _cmd_demo, "prefill on one instance, decode on another, prove the KV moved")
    run = cmd("run", _cmd_run, "execute the notebooks headless, saving executed copies")
    cmd("eta", _cmd_eta, "predict how long notebooks 01, 03 and 04 measure with this config's "
        "workload (the forecast model: 01's profile, else published GB10 figures)")
    sp = cmd("reference", _cmd_reference, "load another run's results (a results directory, "
             "e.g. results/local-cpu or a pair's from the day before): for each notebook this "
             "profile has not run, its results stand in, labelled as the reference's; all are "
             "kept for the notebooks' 'yours vs reference'")
    sp.add_argument("source", help="a results directory holding *_metrics.json files")
    sp.add_argument("--compare-only", action="store_true", help="keep them for comparison "
                    "only; stand in for nothing")
    sp = cmd("jupyter", _cmd_jupyter, "JupyterLab on the notebook host's LAN address and "
             "jupyter.port, with a token; prints the URL to open (Ctrl-C stops it)")
    sp.add_argument("--notebooks-dir", default=None, help=argparse.SUPPRESS)
    sp = cmd("card", _cmd_card, "a one-page card for the pair each config describes (the "
             "notebooks' URL, the machines, where each instance listens, where the keys are, "
             "the commands that get a stuck pair going again); connects to nothing")
    sp.add_argument("configs", nargs="*", help="one config per pair (a page each); "
                    "default: --config's")
    cmd("triage", _cmd_triage, "the triage sheet for failures while serving (docs/TRIAGE.md), "
        "from the failures the lab recognises in logs (the same for every config)")
    lab = cmd("lab", _cmd_lab, "the main job: run the notebooks (or the demo while there are none)")
    for sp in (demo, lab):
        sp.add_argument("--prompts", type=int, default=1, help="fresh prompts to prove transfer on")
        sp.add_argument("--max-tokens", type=int, default=16, help="tokens to generate per prompt")
    for sp in (run, lab):
        sp.add_argument("--from", dest="start", default=None, type=_notebook_number,
                        help="first notebook number, e.g. 00")
        sp.add_argument("--to", dest="stop", default=None, type=_notebook_number,
                        help="last notebook number, e.g. 04")
        sp.add_argument("--notebooks-dir", default=None, help=argparse.SUPPRESS)
    return p


def _masked(message: str, args) -> str:
    """An error message with every secret the profile can reach masked (when the profile
    loads), and always the secret environment variables and key-shaped words."""
    from lab_utils.config import known_secrets, scrub, secrets_in

    secrets = secrets_in(None)
    with contextlib.suppress(Exception):  # the error may be the profile's own
        secrets += known_secrets(load_config(getattr(args, "config", None)))
    return scrub(message, secrets)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LabError as e:
        print(f"error: {_masked(str(e), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; what this command started has been stopped", file=sys.stderr)
        return 130
