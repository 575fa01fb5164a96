"""The "open the hood" cells' claims, judged by the code they describe: NIXL's two-agent
READ really moves the bytes, and every NixlConnector method the connector table names
hands its work to the side the table says, in the installed vLLM's own source."""

from __future__ import annotations

import inspect

import pytest

from lab_utils.notebook import hood as kv_hood
from lab_utils.notebook.hood import CONNECTOR_SIDES, blocks_of, connector_frame

SIDE_OBJECT = {"scheduler": "self.connector_scheduler", "worker": "self.connector_worker"}


@pytest.mark.parametrize("side,method", [(side, m) for side, methods in CONNECTOR_SIDES.items()
                                         for m in methods])
def test_connector_methods_run_on_the_side_the_table_says(side, method):
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    source = inspect.getsource(getattr(NixlConnector, method))
    assert SIDE_OBJECT[side] in source, (method, source[:300])
    other = SIDE_OBJECT["worker" if side == "scheduler" else "scheduler"]
    assert other not in source
    assert len(connector_frame()) == sum(len(m) for m in CONNECTOR_SIDES.values())


def test_two_agent_read_moves_the_bytes():
    got = kv_hood.two_agents(1 << 20)
    assert got["state"] == "DONE" and got["copy equals source"] and got["bytes"] == 1 << 20
    assert got["second READ ms"] > 0


def test_blocks_of():
    assert blocks_of(160, 32) == "160 tokens fill 5 blocks of 32 (the last one 32/32 full)"
    assert blocks_of(161, 32) == "161 tokens fill 6 blocks of 32 (the last one 1/32 full)"
