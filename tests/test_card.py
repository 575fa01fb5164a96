"""The pair card (`python -m lab_utils card`): from the config alone, with this pair's
addresses, ports and config path, where the keys are but never a key, and no connection."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from lab_utils.cli import main
from lab_utils.notebook.card import card_lines

from support.profiles import CANARY_API_KEY, write_secret

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the card connected to something")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_card_of_the_spark_example_names_what_the_config_says(spark_cfg, no_network):
    text = "\n".join(card_lines(spark_cfg))
    host = spark_cfg.notebook_host()
    assert f"http://{spark_cfg.nodes[host].lan_address}:{spark_cfg.jupyter.port}/lab" in text
    for name, node in spark_cfg.nodes.items():
        assert name in text and node.lan_address in text
        if node.data_address != node.lan_address:
            assert node.data_address in text
    for topology in ("baseline", "replicated", "disaggregated"):
        for s in spark_cfg.instances(topology):
            assert f"{s.name} {spark_cfg.nodes[s.node].lan_address}:{s.port}" in text
    assert f":{spark_cfg.proxy.port}" in text
    conf = spark_cfg.source_name
    for command in ("status", "cleanup", "check", "run --from NN", "reference DIR"):
        assert f"python -m lab_utils {command} --config {conf}" in text


def test_the_card_says_where_a_key_is_never_the_key(test_cfg, tmp_path, no_network):
    key = write_secret(tmp_path / "proxy_key", CANARY_API_KEY)
    cfg = test_cfg.model_copy(update={"proxy": test_cfg.proxy.model_copy(
        update={"api_key_file": str(key)})})
    text = "\n".join(card_lines(cfg))
    assert str(key) in text and CANARY_API_KEY not in text
    assert "instances' API key: none set (they use the front door's)" in text


def test_one_page_per_pair_on_the_command_line(tmp_path, capsys, no_network):
    example = json.loads((ROOT / "environment_config.json.example").read_text())
    paths = []
    for n in (1, 2):
        data = {**example, "profile": f"pair-{n:02d}", "results_root": str(tmp_path / "results")}
        path = tmp_path / f"pair-{n:02d}.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))
    assert main(["card", *paths]) == 0
    pages = capsys.readouterr().out.split("\f")
    assert len(pages) == 2
    assert "profile pair-01" in pages[0] and "profile pair-02" in pages[1]
    assert f"--config {paths[1]}" in pages[1]
