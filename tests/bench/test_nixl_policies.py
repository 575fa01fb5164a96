"""The policy comparison's table: one row per policy and round, columns as the header says."""

from __future__ import annotations

import os

from lab_utils.on_node import nixl_threads
from tools.nixl_policies import HEADER, POLICIES, markdown_row


def test_a_row_fits_the_header_and_says_what_was_measured():
    row = {"policy": "nice 19, 0.1 ms slice", "round": 2, "ttft_p50_ms": 27.04, "ttft_max_ms": 171.4,
           "slow": 0, "n": 24, "tpot_ms": 4.46, "busy_ttft_p50_ms": 33.0, "busy_ttft_max_ms": None,
           "failed": 0, "load_avg": 3.09}
    line = markdown_row(row)
    assert line.count("|") == HEADER.splitlines()[0].count("|")
    assert "| 2 | 27.0 | 171 | 0 of 24 | 4.5 | 33 / - | 0 | 3.1 |" in line


def test_the_labs_choice_is_among_the_policies_compared():
    assert POLICIES["nice 19, 0.1 ms slice"] == (os.SCHED_OTHER, nixl_threads.NICE,
                                                 nixl_threads.SLICE_NS)
    assert POLICIES["SCHED_IDLE"][0] == os.SCHED_IDLE
