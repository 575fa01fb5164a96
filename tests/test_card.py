"""The pair card (`python -m lab_utils card`): from the config alone, with this pair's
addresses, ports and config path, where the keys are but never a key, and no connection."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from lab_utils.cli import main
from lab_utils.config import parse_config
from lab_utils.errors import LabError
from lab_utils.notebook.card import card_lines

from support.profiles import CANARY_API_KEY, write_secret

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the card connected to something")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def filled_example(tmp_path, profile: str = "dgx-spark") -> dict:
    """The two-Spark example with its REPLACE values filled in, results and token in tmp."""
    text = (ROOT / "environment_config.json.example").read_text().replace("REPLACE-user", "lab")
    data = json.loads(text)
    data.update(profile=profile, results_root="results")
    data["jupyter"] = {"token_file": str(tmp_path / f"{profile}.token")}
    return data


def test_a_config_with_values_to_fill_in_gets_no_card(spark_cfg, no_network):
    with pytest.raises(LabError) as e:
        card_lines(spark_cfg, "t0ken")
    said = str(e.value)
    assert "nodes.spark-01.ssh.user = 'REPLACE-user'" in said
    assert "nodes.spark-02.workdir = '/home/REPLACE-user/spark-disagg-lab'" in said


def test_the_card_works_on_the_pairs_host_and_names_what_the_config_says(tmp_path, no_network):
    cfg = parse_config(filled_example(tmp_path), str(tmp_path / "pairs" / "pair.json"))
    text = "\n".join(card_lines(cfg, "t0ken-of-the-pair"))
    host = cfg.notebook_host()
    assert (f"Open the notebooks:\n  http://{cfg.nodes[host].lan_address}:{cfg.jupyter.port}"
            "/lab?token=t0ken-of-the-pair") in text
    for name, node in cfg.nodes.items():
        assert name in text and node.lan_address in text
        if node.data_address != node.lan_address:
            assert node.data_address in text
    for topology in ("baseline", "replicated", "disaggregated"):
        for s in cfg.instances(topology):
            assert f"{s.name} {cfg.nodes[s.node].lan_address}:{s.port}" in text
    assert f":{cfg.proxy.port}" in text
    # the commands as typed on the pair's host, in its checkout: nothing of this machine's
    assert "`cd ~/spark-disagg-lab`" in text and str(tmp_path) not in text
    assert "Results: ~/spark-disagg-lab/results/dgx-spark on controller" in text
    for command in ("status", "cleanup", "check", "run --from NN",
                    "reference ~/reference-results"):
        assert f".venv/bin/python -m lab_utils {command}\n" in text + "\n"
    # who drives, when they swap, and the day's checkpoints
    assert "Swap at the break." in text and "1:15  partners swap" in text
    assert " 0:35  notebook 00's verdict" in text and " 2:35  the report" in text


def test_a_notebook_address_no_laptop_reaches_gets_no_card_unless_published(test_cfg, no_network):
    host = test_cfg.notebook_host()
    with pytest.raises(LabError, match=f"nodes.{host}.lan_address"):
        card_lines(test_cfg, "t0ken")
    public = test_cfg.model_copy(update={"jupyter": test_cfg.jupyter.model_copy(
        update={"public_url": "http://10.20.0.5:8801/"})})
    assert "  http://10.20.0.5:8801/lab?token=t0ken" in card_lines(public, "t0ken")


def test_the_card_says_where_a_key_is_never_the_key(tmp_path, no_network):
    key = write_secret(tmp_path / "proxy_key", CANARY_API_KEY)
    data = filled_example(tmp_path)
    data["proxy"]["api_key_file"] = str(key)
    text = "\n".join(card_lines(parse_config(data, str(tmp_path / "pair.json")), "t0ken"))
    assert str(key) in text and CANARY_API_KEY not in text
    assert "instances' API key: none set (they use the front door's)" in text


def test_one_page_per_pair_and_the_same_token_at_every_print(tmp_path, capsys, no_network):
    paths = []
    for n in (1, 2):
        path = tmp_path / f"pair-{n:02d}.json"
        path.write_text(json.dumps(filled_example(tmp_path, f"pair-{n:02d}")))
        paths.append(str(path))
    assert main(["card", *paths]) == 0
    out = capsys.readouterr()
    pages = out.out.split("\f")
    assert len(pages) == 2
    assert "profile pair-01" in pages[0] and "profile pair-02" in pages[1]
    tokens = [(tmp_path / f"pair-{n:02d}.token").read_text().strip() for n in (1, 2)]
    assert tokens[0] != tokens[1] and f"token={tokens[1]}" in pages[1]
    assert f"{tmp_path / 'pair-01.token'}; copy it to the same path on controller" in out.err
    assert main(["card", paths[0]]) == 0  # printed again: the same token, kept in its file
    assert f"token={tokens[0]}" in capsys.readouterr().out
