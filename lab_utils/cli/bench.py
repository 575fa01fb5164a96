"""`bench`: measure a serving endpoint with the lab's load generator."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from pydantic import ValidationError

from lab_utils.cli.args import floats
from lab_utils.config import WorkloadConfig, load_config, read_secret_file
from lab_utils.errors import LabError
from lab_utils.measure import sweep, workload
from lab_utils.results import COMPARED, write_envelope


def run(args) -> int:
    cfg = load_config(args.config)
    overrides = {k: v for k, v in {
        "input_len": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
        "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
        "burstiness": args.burstiness, "duration_s": args.duration, "chat": args.chat or None,
        "range_ratio": args.range_ratio,
        # --dataset as the shell names it; the config's against the checkout, as its paths are
        "dataset": (str(Path(args.dataset).expanduser().resolve()) if args.dataset else
                    str(cfg.resolve_path(cfg.workload.dataset)) if cfg.workload.dataset else None),
        "concurrency": [int(c) for c in floats(args.concurrency) or []] if args.concurrency else None,
        "request_rates": floats(args.rate),
    }.items() if v is not None}
    if args.rate and not args.concurrency:
        overrides["concurrency"] = []
    try:  # validated as the config's workload is (a range ratio of 1.5 is refused)
        w = WorkloadConfig.model_validate({**cfg.workload.model_dump(), **overrides})
    except ValidationError as e:
        raise LabError("bench: " + "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                             for err in e.errors())) from None
    model = args.model or cfg.model.name
    key = (read_secret_file(cfg, str(Path(args.api_key_file).resolve()), "API key (--api-key-file)")
           if args.api_key_file else os.environ.get("OPENAI_API_KEY"))

    tok, detok = (workload.local_tokenizer(args.tokenizer) if args.tokenizer
                  else workload.server_tokenizer(args.url, model, key))
    print(f"workload: {w.describe(args.mixed)}")
    try:
        result = sweep(args.url, model,
                       lambda n, seed: workload.build_requests(
                           w, n, tok, detok, mixed=args.mixed, seed=seed,
                           max_model_len=cfg.vllm.max_model_len), w,
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
