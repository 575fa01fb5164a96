"""The slow-client measurement against the lab's proxy, with short timeouts: every slow
connection is closed by the time the last timeout has passed, none before the first."""

from __future__ import annotations

import json

from tools.slow_clients import measure

from support.fakes import free_port
from support.profiles import make_profile_data


def test_slow_clients_are_closed_at_the_proxy_s_timeouts(tmp_path):
    data = make_profile_data(str(tmp_path / "results"))
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    lan = data["nodes"][data["proxy"]["node"]]["lan_address"]
    r = measure(path, 3, [0.5, 4.0], interval_s=0.25,
                overrides=["proxy.header_timeout_s=1", "proxy.body_timeout_s=2",
                           f"proxy.port={free_port(lan)}"])
    assert r["open_at"][0.5] == {"slow-header": 3, "slow-body": 3}
    assert r["open_at"][4.0] == {"slow-header": 0, "slow-body": 0}
    assert all(0.9 < t < 2.5 for t in r["closed_after_s"]["slow-header"])
    assert all(1.9 < t < 3.5 for t in r["closed_after_s"]["slow-body"])
    assert r["status_lines"] == {"slow-header": ["HTTP/1.1 408 Request Timeout"],
                                 "slow-body": ["HTTP/1.1 408 Request Timeout"]}
