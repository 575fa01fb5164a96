"""vLLM 0.32 judges the plan: every instance's command line of every shipped profile and
topology goes through vLLM's own api_server argument parser and `AsyncEngineArgs`, its
`--kv-transfer-config` through `KVTransferConfig`, and the VLLM_* names the lab sets must
be ones `vllm.envs` knows. Nothing is started; importing vLLM takes ~10-20 s, once.

The example profile is a CUDA profile; the CPU build parses the same flags (its platform
only changes defaults), and the kv_buffer_device is checked against NixlConnector's table
for the profile's device, not this machine's."""

from __future__ import annotations

import json

import pytest

from lab_utils.cluster import Cluster
from lab_utils.config import REPO_ROOT, TOPOLOGIES, parse_config
from lab_utils.kv.memory import GiB
from lab_utils.serve import make_plan
from lab_utils.serve.launcher import API_SERVER_MODULE, SERVE_MODULE

PROFILES = ["environment_config.json.example", "configs/local-cpu.json", "configs/simcluster.json"]
# UCX reads these; the lab sets them only from the config and vLLM has no say in them.
UCX_NAMES = {"UCX_TLS", "UCX_NET_DEVICES"}


@pytest.fixture(scope="module")
def vllm_judge():
    pytest.importorskip("vllm")
    import pydantic
    import vllm.envs
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import _NIXL_SUPPORTED_DEVICE
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parser():
        return make_arg_parser(FlexibleArgumentParser())

    def parse(argv: list[str]):
        parser = make_arg_parser(FlexibleArgumentParser())
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: unknown flag or bad value
            raise AssertionError(f"vLLM's parser refused {argv}: exit {e.code}") from None
        return args, AsyncEngineArgs.from_cli_args(args)

    def parse_serve(argv: list[str]):
        """`vllm serve`'s parser (the tensor-parallel ranks), the positional model taken
        as `vllm serve` takes it, and the ranks' ParallelConfig as vLLM validates it."""
        from vllm.config import ParallelConfig

        from lab_utils.on_node.vllm_serve import parser as serve_parser

        top, _ = serve_parser()
        try:
            args = top.parse_args(["serve", *argv])
        except SystemExit as e:
            raise AssertionError(f"vLLM's serve parser refused {argv}: exit {e.code}") from None
        args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        parallel = ParallelConfig(**{f: getattr(engine, f) for f in (
            "tensor_parallel_size", "nnodes", "node_rank", "master_addr", "master_port",
            "distributed_executor_backend")})
        return args, engine, parallel

    return {"parse": parse, "parse_serve": parse_serve, "parser": parser,
            "kv": pydantic.TypeAdapter(KVTransferConfig),
            "env_names": set(vllm.envs.environment_variables), "nixl": _NIXL_SUPPORTED_DEVICE}


def _profile(tmp_path, name):
    data = json.loads((REPO_ROOT / name).read_text())
    text = json.dumps(data).replace("REPLACE-user", "lab").replace("REPLACE: ", "")
    data = json.loads(text)
    data["results_root"] = str(tmp_path / "results")
    return parse_config(data, name)


@pytest.mark.parametrize("profile", PROFILES)
def test_vllm_accepts_every_instance_of_every_topology(vllm_judge, tmp_path, profile):
    cfg = _profile(tmp_path, profile)
    for topology in TOPOLOGIES:
        plan = make_plan(Cluster(cfg), topology, mem_total=120 * GiB, read_nodes=False)
        assert plan.fits, plan.text()
        for inst in plan.instances:
            if inst.role == "tp":
                assert inst.argv[1:3] == ["-m", SERVE_MODULE]
                args, engine, parallel = vllm_judge["parse_serve"](inst.argv[3:])
                _check_rank(cfg, inst, args, parallel)
            else:
                assert inst.argv[1:3] == ["-m", API_SERVER_MODULE]
                args, engine = vllm_judge["parse"](inst.argv[3:])
            assert engine.model == cfg.model_path_on(inst.node)
            assert engine.served_model_name in (cfg.model.name, [cfg.model.name])
            if inst.url:
                assert args.port == int(inst.url.rsplit(":", 1)[1])
            if cfg.vllm.device == "cuda":
                want = getattr(cfg.vllm, inst.role)
                assert engine.gpu_memory_utilization == want.gpu_memory_utilization
            raw = (inst.argv[inst.argv.index("--kv-transfer-config") + 1]
                   if "--kv-transfer-config" in inst.argv else None)
            if inst.role in ("prefill", "decode"):
                kv = vllm_judge["kv"].validate_json(raw)
                parsed = engine.kv_transfer_config
                assert [getattr(parsed, f) for f in ("kv_connector", "kv_role", "kv_buffer_device",
                                                     "kv_connector_extra_config")] == [
                    getattr(kv, f) for f in ("kv_connector", "kv_role", "kv_buffer_device",
                                             "kv_connector_extra_config")]
                assert kv.kv_role == {"prefill": "kv_producer", "decode": "kv_consumer"}[inst.role]
                assert kv.kv_buffer_device in vllm_judge["nixl"][cfg.vllm.device]
            else:
                assert raw is None and engine.kv_transfer_config is None
            for name in inst.env:
                if name.startswith("VLLM_"):
                    assert name in vllm_judge["env_names"], f"{name}: not a vLLM 0.32 variable"
                elif name.startswith(("UCX_", "NIXL_")):
                    assert name in UCX_NAMES and name not in vllm_judge["env_names"]


def _check_rank(cfg, inst, args, parallel) -> None:
    """A tensor-parallel rank: one per node in the configured order, every rank pointed at
    rank 0's data-plane address and the configured port, only rank 0 serving HTTP."""
    tp = cfg.topology.tensor_parallel
    rank = tp.nodes.index(inst.node)
    assert parallel.world_size == parallel.tensor_parallel_size == parallel.nnodes == len(tp.nodes)
    assert parallel.node_rank == rank and parallel.distributed_executor_backend == "mp"
    assert (parallel.master_addr, parallel.master_port) == (
        cfg.nodes[tp.nodes[0]].data_address, tp.master_port)
    assert args.headless == (rank > 0) and (inst.url is None) == (rank > 0)
    if cfg.vllm.device == "cuda":  # NCCL and Gloo named the data-plane link, exactly
        node = cfg.nodes[inst.node]
        assert inst.env["NCCL_SOCKET_IFNAME"] == "=" + node.data_ifname
        assert inst.env["GLOO_SOCKET_IFNAME"] == node.data_ifname
        assert inst.env["NCCL_IB_HCA"] == "=" + node.data_netdev


def test_every_profile_has_the_tensor_parallel_ranks(tmp_path):
    for profile in PROFILES:
        cfg = _profile(tmp_path, profile)
        assert [s.rank for s in cfg.instances("tensor-parallel")] == [0, 1], profile


def test_vllm_refuses_what_the_judge_should_catch(vllm_judge):
    """The judge has teeth: an unknown flag, a bad value, a bad connector config."""
    with pytest.raises(AssertionError, match="refused"):
        vllm_judge["parse"](["--model", "m", "--no-such-flag", "1"])
    with pytest.raises(AssertionError, match="refused"):
        vllm_judge["parse"](["--model", "m", "--gpu-memory-utilization", "lots"])
    with pytest.raises(AssertionError, match="refused"):
        vllm_judge["parse"](["--model", "m", "--kv-transfer-config",
                             '{"kv_connector":"NixlConnector","kv_rolle":"kv_producer"}'])
    assert "auto" not in vllm_judge["nixl"]["cuda"]  # why "auto" is resolved before launch
    with pytest.raises(AssertionError, match="refused"):
        vllm_judge["parse_serve"](["m", "--nnodes", "two"])
    with pytest.raises(ValueError, match="nnodes > 1"):  # Ray cannot take --nnodes
        vllm_judge["parse_serve"](["m", "-tp", "2", "--nnodes", "2",
                                   "--distributed-executor-backend", "ray"])


def test_the_agreement_benchmarks_baseline_has_no_prefix_cache(vllm_judge, tmp_path):
    """`bench.loadgen` turns prefix caching off on the instance it measures, and vLLM reads
    the flag as meant (and the profile itself keeps vLLM's default: on)."""
    from lab_utils.bench.loadgen import without_prefix_caching

    cfg = _profile(tmp_path, "configs/local-cpu.json")
    for c, cached in ((cfg, True), (without_prefix_caching(cfg), False),
                      (without_prefix_caching(without_prefix_caching(cfg)), False)):
        plan = make_plan(Cluster(c), "baseline", mem_total=120 * GiB, read_nodes=False)
        (inst,) = plan.instances
        _, engine = vllm_judge["parse"](inst.argv[3:])
        assert engine.enable_prefix_caching is not False if cached else engine.enable_prefix_caching is False
        assert inst.argv.count("--no-enable-prefix-caching") == (0 if cached else 1)


# extra_args spellings that vLLM's parser reads as a flag the lab sets, or as a secret
OVERRIDES = [
    (["--host=0.0.0.0"], "host"), (["--host", "0.0.0.0"], "host"), (["--ho=0.0.0.0"], "host"),
    (["--port=9"], "port"), (["--por", "9"], "port"), (["--seed=7"], "seed"),
    (["--max_model_len=9"], "max_model_len"), (["--served_model_name", "x"], "served_model_name"),
    (["--model=/etc"], "model"), (["--dtype=half"], "dtype"), (["--revision=x"], "revision"),
    (["--kv_transfer_config={}"], "kv_transfer_config"), (["--middleware=x.Y"], "middleware"),
    (["--no-enforce-eager"], "enforce_eager"), (["--block_size=64"], "block_size"),
    (["--kv-transfer-config.kv_role=kv_both"], "kv_transfer_config"),  # vLLM's dotted form
    (["--kv_transfer_config.kv_role", "kv_both"], "kv_transfer_config"),
    (["--api_key=sk-hostile-0123456789"], "api_key"), (["--api-key", "sk-x"], "api_key"),
    (["--hf_token=hf_x"], "hf_token"), (["--uds=/tmp/s"], "uds"),
]


@pytest.mark.parametrize("extra,dest", OVERRIDES, ids=[" ".join(e) for e, _ in OVERRIDES])
def test_extra_args_that_vllm_reads_as_a_lab_flag_are_refused(vllm_judge, tmp_path, extra, dest):
    """vLLM's own parser shows the spelling sets the lab's flag (or a secret) after the lab
    set it; the config refuses it, naming the flag and not its value."""
    from lab_utils.config.values import check_args

    cfg = _profile(tmp_path, "configs/local-cpu.json")
    plan = make_plan(Cluster(cfg), "disaggregated", mem_total=120 * GiB, read_nodes=False)
    argv = plan.instances[0].argv[3:]
    parser = vllm_judge["parser"]()
    before = vars(parser.parse_args(argv))
    after = vars(vllm_judge["parser"]().parse_args(argv + extra))
    assert after[dest] != before[dest], f"{extra} does not change --{dest}"
    with pytest.raises(ValueError) as e:
        check_args(extra)
    assert "=" not in str(e.value) and "sk-" not in str(e.value) and "0.0.0.0" not in str(e.value)


def test_a_config_file_and_kv_events_are_refused(vllm_judge, tmp_path):
    """vLLM's --config file sets any flag, the lab's and the API key included (vLLM's
    parser shows it), out of the config's sight; --kv-events-config publishes on an
    endpoint of its own. Both are refused in extra_args, in every spelling."""
    from lab_utils.config.values import check_args

    cfg = _profile(tmp_path, "configs/local-cpu.json")
    plan = make_plan(Cluster(cfg), "disaggregated", mem_total=120 * GiB, read_nodes=False)
    argv = plan.instances[0].argv[3:]
    options = tmp_path / "x.yaml"
    options.write_text("host: 0.0.0.0\napi-key: short\n")
    after = vars(vllm_judge["parser"]().parse_args(["--config", str(options), *argv]))
    assert after["api_key"] == ["short"] or after["api_key"] == "short"
    for extra in (["--config", str(options)], [f"--config={options}"], ["--conf", "x"],
                  ["--kv-events-config", '{"endpoint": "tcp://*:5557"}'],
                  ["--kv_events_config.endpoint=tcp://*:5557"]):
        with pytest.raises(ValueError, match="file|KV-cache events"):
            check_args(extra)
    check_args(["--config-format", "auto"])  # another option that starts alike


def test_extra_env_cannot_set_what_the_lab_sets(tmp_path):
    """Every variable the launcher sets (any profile, topology and role) is one extra_env
    may not set; the config refuses it by name."""
    from lab_utils.config.values import LAB_OWNED_ENV, check_env
    from lab_utils.serve.launcher import server_env

    # HF_TOKEN: the lab sets it after extra_env, from hf_token_file or $HF_TOKEN
    general = {"VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "PYTHONUNBUFFERED", "HF_TOKEN"}
    for profile in PROFILES:
        cfg = _profile(tmp_path, profile)
        for topology in TOPOLOGIES:
            for spec in cfg.instances(topology):
                assert set(server_env(cfg, spec)) - general <= set(LAB_OWNED_ENV), spec.name
    for name in LAB_OWNED_ENV:
        with pytest.raises(ValueError, match=name):
            check_env({name: "x"})
    check_env({"VLLM_LOGGING_LEVEL": "DEBUG"})


def test_the_lab_owned_flags_are_vllms_and_cover_every_flag_the_launcher_sets(vllm_judge, tmp_path):
    from lab_utils.config.values import LAB_OWNED_FLAGS, check_args

    options = vllm_judge["parser"]()._option_string_actions
    assert all(f"--{f}" in options for f in LAB_OWNED_FLAGS)
    for profile in PROFILES:
        cfg = _profile(tmp_path, profile)
        for topology in TOPOLOGIES:
            plan = make_plan(Cluster(cfg), topology, mem_total=120 * GiB, read_nodes=False)
            for inst in plan.instances:
                set_by_lab = {a[2:] for a in inst.argv[3:] if a.startswith("--")}
                extra = set(cfg.vllm.extra_args) | set(getattr(cfg.vllm, inst.role).extra_args)
                assert set_by_lab - set(LAB_OWNED_FLAGS) <= {a[2:] for a in extra}, inst.name
    # what the lab's own profiles and the agreement benchmark add stays allowed
    check_args(["--kv-cache-memory-bytes", "32G", "--no-enable-prefix-caching", "-tp", "2"])
