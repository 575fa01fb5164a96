"""The stall experiment's config changes and its table row (the runs need vLLM and NIXL;
they are measurements, recorded in docs/REHEARSAL.md, not tests)."""

from tools.pd_stall import HEADER, _apply, markdown


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


def _run(topology, variant, tpot, p99, held=0.0):
    point = {"tpot_ms": tpot, "itl_p50_ms": 1.0, "itl_p99_ms": p99, "ttft_ms": 50.0,
             "failed": 0, "duration_s": 3.0, "held_up_s": held}
    return {"topology": topology, "variant": variant, "one": point,
            "mixed": {**point, "held_up_s": 0.0}, "load_avg": [2.0, 3.0]}


def test_compare_verdicts_follow_the_figures():
    from tools.pd_compare import HEADER as CMP_HEADER
    from tools.pd_compare import VARIANTS, verdicts
    from tools.pd_compare import markdown as cmp_markdown

    as_is, lowered, lab = VARIANTS
    rows = [_run("baseline", None, 2.0, 100.0), _run("replicated", None, 2.0, 40.0),
            _run("disaggregated", as_is, 7.0, 45.0, held=1.5),
            _run("disaggregated", lowered, 2.8, 30.0), _run("disaggregated", lab, 2.2, 50.0)]
    said = verdicts(rows)
    assert "last core: TPOT at concurrency 1 3.50x the single instance's (over" in said[0]
    assert "not the lowest" in said[1]
    assert "0.1 ms slice; workers on their binds: TPOT at concurrency 1 1.40x the single" in said[2]
    assert said[3].endswith(": the lowest")
    assert "up to 1 ms; workers on their binds: TPOT at concurrency 1 1.10x" in said[4]
    assert said[5].endswith("not the lowest")
    assert said[6] == ("stood still: disaggregated, as vLLM leaves it: NIXL threads poll without "
                       "pause at normal priority; both workers on the last core (one)")
    table = cmp_markdown(rows).splitlines()
    assert table[:2] == CMP_HEADER.splitlines() and len(table) == 7
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "| 2 to 3 |" in table[-1]
