"""The tensor-parallel topology without starting vLLM: its ranks and how the profile must
hold them, each rank's memory share, the plan of a model too big for one Spark (offline,
connecting to nothing), the proxy in front of rank 0, a rank never left alone (real
processes standing in for the ranks), a headless rank watched while rank 0 starts, and the
output judge letting the first token be a near tie only for a split model."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from lab_utils.cli import main
from lab_utils.cluster import Cluster
from lab_utils.config import REPO_ROOT, parse_config
from lab_utils.errors import ConfigError, LabError, ProcessFailedError
from lab_utils.kv import memory
from lab_utils.kv.memory import GiB
from lab_utils.kv.shapes import PUBLISHED_CONFIGS
from lab_utils.serve.launcher import rank_env, wait_ready
from lab_utils.serve.pd import judge_tokens
from lab_utils.serve.proxy_settings import settings_from_config
from lab_utils.serve.tp import lone_ranks, stop_lone_ranks

EXAMPLE = REPO_ROOT / "environment_config.json.example"
BIG = "Qwen/Qwen3-235B-A22B-GPTQ-Int4"


def example_data(tmp_path) -> dict:
    data = json.loads(EXAMPLE.read_text())
    data["results_root"] = str(tmp_path / "results")
    return data


def problems_of(data: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.json")
    return str(e.value)


def test_one_rank_per_node_rank_0_serves_the_others_headless(test_cfg):
    ranks = test_cfg.instances("tensor-parallel")
    tp = test_cfg.topology.tensor_parallel
    assert [(s.name, s.node, s.rank, s.ranks) for s in ranks] == [
        ("tp-0", "spark-01", 0, 2), ("tp-1", "spark-02", 1, 2)]
    assert [s.headless for s in ranks] == [False, True]
    assert all(s.master == ("spark-01", tp.master_port) for s in ranks)
    # the proxy fronts rank 0 alone
    s = settings_from_config(test_cfg, "tensor-parallel")
    assert s.mode == "replicated" and s.backends == [
        f"http://{test_cfg.nodes['spark-01'].lan_address}:{ranks[0].port}"]


def test_the_profile_holds_both_halves_or_neither(tmp_path):
    data = example_data(tmp_path)
    del data["vllm"]["tp"]
    assert "vllm.tp: missing" in problems_of(data)
    data = example_data(tmp_path)
    del data["topology"]["tensor_parallel"]
    assert "topology.tensor_parallel: missing" in problems_of(data)
    data = example_data(tmp_path)
    data["topology"]["tensor_parallel"]["nodes"] = ["spark-01", "spark-01"]
    assert "names a node twice" in problems_of(data)
    data = example_data(tmp_path)
    del data["nodes"]["spark-02"]["data_ifname"]
    assert "nodes.spark-02.data_ifname: missing" in problems_of(data)
    data = example_data(tmp_path)  # the rendezvous port must be free of the lab's others
    data["topology"]["tensor_parallel"]["master_port"] = data["vllm"]["prefill"]["side_channel_port"]
    assert "tensor-parallel rendezvous on spark-01" in problems_of(data)
    # without either, the profile is valid and the topology has no ranks; serve says so
    data = example_data(tmp_path)
    del data["vllm"]["tp"], data["topology"]["tensor_parallel"]
    cfg = parse_config(data, str(EXAMPLE))
    assert cfg.instances("tensor-parallel") == []
    from lab_utils.serve import serve

    with pytest.raises(LabError, match="add topology.tensor_parallel and vllm.tp"):
        serve(Cluster(cfg), "tensor-parallel")


def test_nccl_and_gloo_are_named_the_data_plane_link(spark_cfg, test_cfg):
    for spec in spark_cfg.instances("tensor-parallel"):
        node = spark_cfg.nodes[spec.node]
        assert rank_env(spark_cfg, spec) == {
            "VLLM_HOST_IP": node.data_address, "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
            "NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1",
            # which network NCCL chose, in the rank's log (serve.startup.collective)
            "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
            # in a line-buffered file of its own, one per process (NCCL fills in %p)
            "NCCL_DEBUG_FILE": f"/home/REPLACE-user/spark-disagg-lab/logs/dgx-spark/"
                               f"{spec.name}-nccl.%p.log"}
    # the CPU build has no NCCL: Gloo carries the all-reduces
    env = rank_env(test_cfg, test_cfg.instances("tensor-parallel")[1])
    assert env == {"VLLM_HOST_IP": "127.0.0.3", "GLOO_SOCKET_IFNAME": "lo"}


def test_each_rank_holds_its_share_of_the_weights_and_kv_heads(spark_cfg):
    hf = PUBLISHED_CONFIGS["RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"]
    w = memory.weights(spark_cfg, hf, None)

    def budget(ranks, config=hf):
        return memory.instance_memory(spark_cfg, config, w, 128 * GiB, utilization=0.85,
                                      kv_cache_bytes=None, cpu_kvcache_gib=None, mirror=False,
                                      ranks=ranks)

    one, two = budget(1), budget(2)
    assert one.kv_bytes > 0 and two.kv_bytes > one.kv_bytes
    assert two.items[0].bytes == w.bytes // 2 and one.items[0].bytes == w.bytes
    # 80 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 320 KiB a token; 4 heads a rank
    per_token = 80 * 2 * 128 * 2
    assert one.kv_tokens == one.kv_bytes // (8 * per_token)
    assert two.kv_tokens == two.kv_bytes // (4 * per_token)
    # fewer KV heads than ranks: vLLM repeats a head, so a rank holds one per token
    single_head = {**hf, "num_key_value_heads": 1}
    assert budget(2, single_head).kv_tokens == budget(2, single_head).kv_bytes // per_token


def test_quantized_weights_are_counted_at_their_bits(spark_cfg):
    hf = PUBLISHED_CONFIGS["RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"]
    embed = 128256 * 8192 * 2  # input and output embeddings stay 16-bit
    n = memory.param_count(hf)
    w = memory.weights(spark_cfg, hf, None)
    assert memory.weight_bits(hf) == 8 and w.bytes == (n - embed) + embed * 2
    # the published 8-bit Llama-3.1-70B checkpoints hold 72.7 GB of weight files
    assert abs(w.bytes / 72.7e9 - 1) < 0.02
    assert memory.weight_bits({"quantization_config": {"config_groups": {
        "g": {"weights": {"num_bits": 4}}}}}) == 4
    assert memory.weight_bits({"quantization_config": {"quant_method": "fp8"}}) == 8
    assert memory.weight_bits(PUBLISHED_CONFIGS["Qwen/Qwen3-8B"]) is None


def test_a_model_too_big_for_one_spark_fits_split_over_two(tmp_path, capsys, no_node_reached):
    path = tmp_path / "spark.json"
    path.write_text(json.dumps(example_data(tmp_path)))
    args = ["serve", "--config", str(path), "--dry-run", "--offline", "--model", BIG]
    assert main([*args, "--topology", "baseline"]) == 1
    alone = capsys.readouterr().out
    assert "DOES NOT FIT: no room for a KV cache in baseline-0" in alone
    assert "split the model over the nodes: the tensor-parallel topology" in alone
    assert main([*args, "--topology", "tensor-parallel"]) == 0
    split = capsys.readouterr().out
    assert split.count("FITS") == 2 and "[tp-1] on spark-02" in split
    assert "2 of 4 KV heads per rank" in split and "--headless" in split
    assert "NCCL_SOCKET_IFNAME==enp1s0f1np1" in split and "--master-addr 192.168.100.10" in split
    tokens = [int(line.split()[-2].replace(",", "")) for line in split.splitlines()
              if "KV cache holds" in line]
    assert len(tokens) == 2 and tokens[0] == tokens[1] > 100_000
    # --model is for a plan only
    assert main(["serve", "--config", str(path), "--topology", "tensor-parallel",
                 "--model", BIG]) != 0
    assert "--model is for --dry-run" in capsys.readouterr().err


def _rank(node, name: str, tmp_path, argv: list[str]):
    return node.start_detached(name, [sys.executable, "-c", *argv],
                               log_path=str(tmp_path / f"{name}.log"), kind="vllm",
                               extra={"topology": "tensor-parallel", "role": "tp"})


def test_a_rank_that_dies_takes_the_others_down(test_cfg, tmp_path, capsys):
    with Cluster(test_cfg) as cluster:
        r0 = _rank(cluster.node("spark-01"), "tp-0", tmp_path, ["import time; time.sleep(60)"])
        r1 = _rank(cluster.node("spark-02"), "tp-1", tmp_path, ["import time; time.sleep(60)"])
        assert lone_ranks(cluster, [r0, r1]) == ([], [])
        assert stop_lone_ranks(cluster, [r0, r1]) is None
        os.killpg(r1.pgid, signal.SIGKILL)  # it dies; its record stays
        deadline = time.monotonic() + 10
        while cluster.node("spark-02").is_alive(r1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lone_ranks(cluster, cluster.running()) == ([r1], [r0])
    # `status` finds it and stops rank 0, saying why
    assert main(["status", "--config", str(test_cfg.source)]) == 0
    out = capsys.readouterr().out
    assert "tp-1 of the tensor-parallel instance died; stopped tp-0 too" in out
    with Cluster(test_cfg) as cluster:
        assert not cluster.node("spark-01").is_alive(r0)
        cluster.stop(cluster.running())


def test_a_headless_rank_is_watched_while_rank_0_starts(test_cfg, tmp_path):
    with Cluster(test_cfg) as cluster:
        alive = _rank(cluster.node("spark-02"), "tp-1", tmp_path, ["import time; time.sleep(60)"])
        try:
            assert set(wait_ready(cluster, [alive], timeout=10, show_progress=False)) == {"tp-1"}
        finally:
            cluster.stop([alive])
        # rank 0 not answering yet (nothing listens on its port), rank 1 dies meanwhile
        rank0 = cluster.node("spark-01").start_detached(
            "tp-0", [sys.executable, "-c", "import time; time.sleep(60)"],
            log_path=str(tmp_path / "tp-0.log"), kind="vllm", url="http://127.0.0.2:9",
            extra={"topology": "tensor-parallel", "role": "tp"})
        dead = _rank(cluster.node("spark-02"), "tp-1", tmp_path,
                     ["import time; time.sleep(1); print('rank 1: no route to rank 0'); "
                      "raise SystemExit(3)"])
        try:
            with pytest.raises(ProcessFailedError, match="tp-1 on node spark-02 exited") as e:
                wait_ready(cluster, [rank0, dead], timeout=30, show_progress=False)
            assert "no route to rank 0" in str(e.value)
        finally:
            cluster.stop([rank0, dead])


def test_only_a_split_model_may_tie_at_its_first_token():
    steps = [{7: -0.70, 9: -0.80}, {1: -0.1}]
    assert not judge_tokens([7, 1], [9, 1], strict=False, pd_logprobs=steps).ok
    v = judge_tokens([7, 1], [9, 1], strict=False, pd_logprobs=steps, first_may_tie=True)
    assert v.ok and v.diverged_at == 0 and abs(v.margin - 0.1) < 1e-9
    far = [{7: -0.1, 9: -2.0}]
    assert not judge_tokens([7], [9], strict=False, pd_logprobs=far, first_may_tie=True).ok


def test_a_fall_back_to_sockets_is_labelled_and_not_graded():
    from lab_utils.results import CollectiveRow, collective_said
    from lab_utils.results.payloads import not_graded

    rdma = CollectiveRow(rank=0, node="spark-01", backend="nccl", net="IB",
                         devices=["rocep1s0f1:1", "roceP2p1s0f1:1"])
    sockets = CollectiveRow(rank=1, node="spark-02", backend="nccl", net="Socket",
                            devices=["enp1s0f1np1:192.168.100.11"])
    assert not_graded([rdma, rdma.model_copy(update={"rank": 1})]) is None
    why = not_graded([rdma, sockets])
    assert why is not None and "rank 1" in why and "RDMA link's rate" in why
    said = collective_said([rdma, sockets])
    assert "rank 0 (spark-01): NCCL, RDMA (NCCL's IB transport) on rocep1s0f1:1" in said
    assert "rank 1 (spark-02): NCCL, TCP sockets (NCCL's fall-back)" in said
    assert "not graded against the forecast" in said
    assert "not graded" not in collective_said([rdma])
