"""The proxy's hand-written checks (a controller without vLLM) against vLLM's own rules
(`VllmRules`: vLLM's request models and sampling checks, which test_proxy_engine shows
equal to what one instance answers): three generated corpora of 600 completions and chat
requests each (tests/support/request_corpus.py, three seeds: the same field values in
different combinations), each request judged both ways, offline. They must agree on
every request: refused by one exactly where refused by the other, with the same status.
A hand check that refuses what vLLM takes blocks a valid request; one that takes what
vLLM refuses costs a prefill before the decode refuses it."""

from __future__ import annotations

from collections import Counter

import pytest

from lab_utils.serve.validate import InvalidRequest, Limits, check_request, vllm_rules

from support.request_corpus import corpus


@pytest.fixture(scope="module")
def rules():
    loaded = vllm_rules()
    assert loaded is not None, "this Python has no vLLM: `make venv` installs the rehearsal's"
    return loaded


def verdict(body: dict, path: str, rules) -> int | None:
    try:
        check_request(body, path, Limits(max_n=8, max_tokens=4096), rules)
    except InvalidRequest as e:
        return e.status
    return None


@pytest.mark.parametrize("seed", [46, 7, 99])
def test_the_hand_checks_refuse_exactly_what_vllm_refuses(rules, seed, capsys):
    seen: Counter[str] = Counter()
    differ = []
    for path, body in corpus("tiny", seed=seed):
        vllm, hand = verdict(body, path, rules), verdict(body, path, None)
        seen["refused" if vllm else "accepted"] += 1
        if vllm != hand:
            differ.append((path, body, f"vLLM {vllm or 'accepts'}", f"hand {hand or 'accepts'}"))
    with capsys.disabled():
        print(f"\n[hand rules] corpus seed {seed}: {sum(seen.values())} requests, vLLM refuses "
              f"{seen['refused']}, accepts {seen['accepted']}; the hand checks differ on "
              f"{len(differ)}")
    assert sum(seen.values()) >= 500 and seen["refused"] > 100 and seen["accepted"] > 100
    assert differ == [], differ[:10]
