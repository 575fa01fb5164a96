"""`tiny-model`: generate the rehearsal's tiny Llama model."""

from __future__ import annotations

from lab_utils.cluster import tiny_model


def run(args) -> int:
    out = tiny_model.generate(args.out_dir, seed=args.seed, force=args.force)
    print(f"tiny model in {out} (sha256 {tiny_model.fingerprint(out)[:16]})")
    return 0
