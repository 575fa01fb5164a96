"""One model across nodes (the tensor-parallel topology): its ranks as one instance, and
the proof that splitting the model left its output alone.

The ranks are separate process groups on separate nodes, but one instance: rank 0 serves
the API and drives the others. When a rank other than 0 dies, rank 0's engine fails its
next request and exits (seen on the CPU build); when rank 0 dies, the other ranks wait
for it for ever. So a rank is never left alone: `lone_ranks` finds the live ranks of an
instance that lost one, `stop_lone_ranks` stops them, and `serve` and `status` call it.

`collective` reads from each rank's log how its all-reduces travel (NCCL over RDMA, NCCL's
socket fall-back, or Gloo on the CPU build), for notebook 04 and the report.

`prove_same_output` sends notebook 01's reference prompts to rank 0 and judges its greedy
tokens against the single instance's with `pd.judge_tokens`, not exactly but allowing a
near tie: the ranks sum their halves of every layer's output in another order than one
instance sums the whole, so a logit can move in its last bits and greedy decoding can
take the runner-up where two tokens are nearly tied, on the CPU build too. Where the
tokens part, the single instance's token must be within `pd.NEAR_TIE_NATS` of the one the
split model chose, by the split model's own logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.measure.loadgen import auth_headers
from lab_utils.results.payloads import CollectiveRow
from lab_utils.serve.launcher import nccl_lines
from lab_utils.serve.pd import TokenVerdict, complete_scored, judge_tokens
from lab_utils.serve.startup import collective as read_collective

TOPOLOGY = "tensor-parallel"
HEAD_LINES = 4000  # the collectives start before the first request: the log's head holds them


def collective(cluster: Cluster) -> list[CollectiveRow]:
    """Per running rank, in rank order: how its all-reduces travel (`startup.collective`).
    Read from the head of each rank's log and its NCCL files (`launcher.nccl_log`)."""
    ranks = sorted((r for r in cluster.running(TOPOLOGY) if r.kind == "vllm"),
                   key=lambda r: int(r.extra.get("rank", 0)))
    out = []
    for r in ranks:
        node = cluster.node(r.node)
        head = node.run(["head", "-n", str(HEAD_LINES), r.log_path], timeout=30)
        text = (head.stdout if head.ok else "") + "\n" + nccl_lines(cluster.cfg, node, r)
        out.append(CollectiveRow(rank=int(r.extra.get("rank", 0)), node=r.node,
                                 **read_collective(text)))
    return out


def lone_ranks(cluster: Cluster, records: list[ProcessRecord]) -> tuple[list[ProcessRecord],
                                                                         list[ProcessRecord]]:
    """(dead, alive) ranks of a tensor-parallel instance that lost one or more; ([], [])
    when every rank lives or none does."""
    ranks = [r for r in records if r.extra.get("topology") == TOPOLOGY and r.kind == "vllm"]
    alive = [r for r in ranks if cluster.knows(r.node) and cluster.node(r.node).is_alive(r)]
    dead = [r for r in ranks if r not in alive]
    return (dead, alive) if dead and alive else ([], [])


def stop_lone_ranks(cluster: Cluster, records: list[ProcessRecord]) -> str | None:
    """Stop the live ranks of an instance that lost a rank; say what was done (None:
    nothing to do)."""
    dead, alive = lone_ranks(cluster, records)
    if not alive:
        return None
    cluster.stop(alive)
    return (f"{', '.join(r.name for r in dead)} of the tensor-parallel instance died; stopped "
            f"{', '.join(r.name for r in alive)} too (the model needs every rank). Its log: "
            f"{dead[0].log_path} on {dead[0].node}")


@dataclass(frozen=True)
class SameOutput:
    """One prompt's greedy tokens from the split model against the single instance's."""

    prompt_tokens: int
    tokens: list[int]
    baseline: list[int]
    verdict: TokenVerdict


def prove_same_output(url: str, model: str, prompts: list[list[int]],
                      baseline_tokens: list[list[int]], *, api_key: str | None = None,
                      timeout: float = 120.0) -> list[SameOutput]:
    """Each prompt once through the split model (greedy, with each step's top logprobs),
    judged against the single instance's tokens for it."""
    out = []
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
        for ids, base in zip(prompts, baseline_tokens, strict=True):
            tokens, logprobs = complete_scored(client, url, model, ids, len(base))
            out.append(SameOutput(len(ids), tokens, base,
                                  judge_tokens(tokens, base, strict=False, pd_logprobs=logprobs,
                                               first_may_tie=True)))
    return out
