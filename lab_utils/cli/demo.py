"""`demo`: the prefill/decode proof of transfer on the configured profile."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.notebook import kv_buffer_device
from lab_utils.serve import demo


def run(args) -> int:
    cfg = load_config(args.config)
    proofs = demo.run_demo(cfg, n_prompts=args.prompts, max_tokens=args.max_tokens,
                      kv_buffer_device=kv_buffer_device(cfg))
    return 0 if all(p.ok for p in proofs) else 1
