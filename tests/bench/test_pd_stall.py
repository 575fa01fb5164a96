"""The stall experiment's config changes and its table row (the runs need vLLM and NIXL;
they are measurements, recorded in docs/REHEARSAL.md, not tests)."""

from lab_utils.bench.pd_stall import HEADER, _apply, markdown


def test_a_setting_changes_one_key_and_keeps_its_neighbours():
    raw = {"kv_transfer": {"extra_config": {"kv_lease_duration": 12}}, "vllm": {"extra_env": {"A": "1"}}}
    _apply(raw, "kv_transfer.extra_config.num_threads=0")
    _apply(raw, "kv_transfer.ucx_tls=sm,tcp,self")
    _apply(raw, "vllm.extra_env={}")
    assert raw == {"kv_transfer": {"extra_config": {"kv_lease_duration": 12, "num_threads": 0},
                                   "ucx_tls": "sm,tcp,self"},
                   "vllm": {"extra_env": {}}}


def test_a_row_has_one_cell_per_column_and_dashes_for_what_was_not_measured():
    row = {"label": "x", "idle": {"busy_threads": 2, "busy_cpu": 1.98, "busy_system_share": 0.7},
           "single": {"ttft_ms_median_rest": 200.4, "tpot_ms_median": 13.44, "held_up_s": 0.0},
           "load": {"duration_s": 20.6, "tpot_ms_median": None, "held_up_s": 0.0, "failed": 0}}
    line = markdown(row)
    assert line.count("|") == HEADER.splitlines()[0].count("|")
    assert "2 (2.0 CPU, 70% sys)" in line and "| 200 | 13.4 |" in line and "| 20.6 | - |" in line
