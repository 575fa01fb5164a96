"""The short end-to-end run: disaggregated topology up, prompts through prefill then
decode by hand, the proof of transfer printed (prompt tokens by source and NIXL bytes
from the decode instance's counters, and the greedy output compared with the prefill
instance generating the whole answer itself), everything stopped again."""

from __future__ import annotations

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, api_key
from lab_utils.kv.shapes import kv_shape_from_dir
from lab_utils.measure.prompts import fresh_prompts, load_tokenizer
from lab_utils.serve.pd import TransferProof, prove_transfer
from lab_utils.serve.topology import topology_running, urls


def format_proofs(proofs: list[TransferProof]) -> str:
    head = (f"{'prompt':>6} {'external':>8} {'local':>5} {'cached':>6} {'NIXL bytes':>10} "
            f"{'expected':>10} {'xfer ms':>7} {'same tokens as one instance':>28}")
    rows = [head]
    for p in proofs:
        v = p.verdict
        match = ("-" if p.tokens_match is None else "yes" if p.tokens_match
                 else f"near tie at {v.diverged_at}" if v.ok else "NO")
        rows.append(f"{p.prompt_tokens:>6} {p.external_kv_transfer:>8} {p.local_compute:>5} "
                    f"{p.local_cache_hit:>6} {p.nixl_bytes:>10} {p.expected_bytes:>10} "
                    f"{p.nixl_xfer_ms:>7.2f} {match:>28}")
    return "\n".join(rows)


def run_demo(cfg: LabConfig, n_prompts: int = 1, max_tokens: int = 16, *,
             kv_buffer_device: str | None = None) -> list[TransferProof]:
    """Serve the disaggregated topology, prove transfer for fresh prompts, stop it
    (`kv_buffer_device`: as resolved by the caller; None: the configured one)."""
    print(f"profile {cfg.profile}: starting the disaggregated topology "
          "(first start of a vLLM instance here takes 15-90 s)", flush=True)
    with Cluster(cfg) as cluster, topology_running(cluster, "disaggregated",
                                                   kv_buffer_device=kv_buffer_device) as records:
        kv = kv_shape_from_dir(cfg.model_path, cfg.model.dtype)  # present once serving
        tok = load_tokenizer(cfg.model_path)
        lengths = [48 + 40 * i for i in range(n_prompts)]
        prompts, seed = fresh_prompts(tok, lengths)
        prefill_url = urls(records, "prefill")[0]
        # The reference output: the prefill instance generating the whole answer itself.
        proofs = prove_transfer(prompts, model=cfg.model.name, prefill_url=prefill_url,
                                decode_url=urls(records, "decode")[0], kv=kv, max_tokens=max_tokens,
                                baseline_url=prefill_url, strict=cfg.vllm.device == "cpu",
                                api_key=api_key(cfg, "vllm"))
    layout = (f"{kv.layers} layers x {kv.head_dim} latent x {kv.dtype_bytes} bytes" if kv.mla else
              f"{kv.layers} layers x {kv.kv_heads} KV heads x {kv.head_dim} head dim x 2 (K,V) "
              f"x {kv.dtype_bytes} bytes")
    print(f"\nKV per token: {kv.bytes_per_token} bytes ({layout}); block size "
          f"{proofs[0].block_size}; prompt seed {seed}")
    print(format_proofs(proofs))
    for p in proofs:
        print(f"first decode tokens: {p.pd_tokens[:12]}")
    verdict = all(p.ok for p in proofs)
    print("\nproof of transfer: " + ("every prompt token came over NIXL, bytes as predicted, "
                                     "and the output equals one instance's (on a GPU: up to a late near tie)" if verdict
                                     else "FAILED (see the table above)"))
    print("all instances stopped.")
    return proofs
