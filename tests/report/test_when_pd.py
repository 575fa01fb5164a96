"""When P/D pays: the forecast's table follows its own goodputs, and the sentences follow
the table (each claim changes when the table says the opposite)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from lab_utils.report.when_pd import EVEN, ITL_BOUNDS, NOBODY, SHAPES, sentences, when_pd_pays

REHEARSAL = SimpleNamespace(device="cpu")  # the Spark forecast then reads the example config


@pytest.fixture(scope="module")
def two_and_four():
    return {n: when_pd_pays(REHEARSAL, nodes=n) for n in (2, 4)}


def test_every_shape_and_bound_is_a_row_and_the_winner_is_higher_by_the_margin(two_and_four):
    for nodes, (frame, _) in two_and_four.items():
        assert len(frame) == len(SHAPES) * (1 + len(ITL_BOUNDS))
        assert set(frame["replicas"]) == {f"{nodes} replicas"}
        for _, r in frame.iterrows():
            g_rep, g_pd = r["replicas' goodput (req/s)"], r["its goodput (req/s)"]
            want = (NOBODY if g_rep == g_pd == 0 else EVEN if max(g_rep, g_pd) <= 1.1 * min(g_rep, g_pd)
                    else r["best split"] if g_pd > g_rep else r["replicas"])
            assert r["winner"] == want
        # a bound never counts more requests good than no bound
        for _, rows in frame.groupby("prompt / output"):
            free = rows[rows["ITL SLO ms"].isna()].iloc[0]
            for _, r in rows[rows["ITL SLO ms"].notna()].iterrows():
                assert r["replicas' goodput (req/s)"] <= free["replicas' goodput (req/s)"] + 1e-12
    assert set(two_and_four[4][0]["best split"]) <= {"1P3D", "2P2D", "3P1D"}


def _frame(wins_without: bool, wins_with: bool, even: bool = False) -> pd.DataFrame:
    rows = []
    for bound in (None, 100.0):
        pd_wins = wins_with if bound else wins_without
        rows.append({"prompt / output": "1024 / 256", "ratio": 4.0, "ITL SLO ms": bound,
                     "replicas": "2 replicas", "replicas' goodput (req/s)": 0.5,
                     "best split": "1P1D",
                     "its goodput (req/s)": 0.51 if even else 1.0 if pd_wins else 0.25,
                     "winner": EVEN if even else "1P1D" if pd_wins else "2 replicas",
                     "P/D ITL p99 ms": 80.0, "replicas' ITL p99 ms": 90.0})
    return pd.DataFrame(rows)


W = SimpleNamespace(concurrency=[16], mixed_long_len=6144, mixed_long_every=4,
                    slo=SimpleNamespace(ttft_ms=1000.0, tpot_ms=100.0))


def test_sentences_follow_the_table():
    won = "\n".join(sentences(_frame(False, True), 2, "m", W))
    assert "without an SLO on the ITL tail, P/D won goodput in 0 of 1 cases" in won
    assert "with an SLO on every token gap, P/D won goodput in 1 of 1 cases" in won
    assert "1024 / 256 (1P1D, SLO 100 ms)" in won and "2.0x the replicas' goodput" in won
    lost = "\n".join(sentences(_frame(False, False), 2, "m", W))
    assert "P/D won no case here" in lost and "largest win" not in lost
    always = "\n".join(sentences(_frame(True, True), 2, "m", W))
    assert "without an SLO on the ITL tail, P/D won goodput in 1 of 1 cases" in always
    even = "\n".join(sentences(_frame(False, False, even=True), 2, "m", W))
    assert "P/D won goodput in 0 of 1 cases (1 where the two were within 10% of each other)" in even
    assert "P/D won no case here" in even
