"""Your own traffic: lengths drawn around the configured ones (`range_ratio`), and prompts
from a file (vllm bench serve's custom JSONL, ShareGPT JSON), checked before anything is
sent; and `bench` sending, against the stub server, exactly what the file says."""

from __future__ import annotations

import json
import sys
import zlib

import pytest

from lab_utils import cli
from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.config import WorkloadConfig
from lab_utils.errors import LabError
from lab_utils.measure.dataset import read_dataset
from lab_utils.measure.workload import build_requests
from lab_utils.on_node.proctools import stop_group

from support.fakes import free_port

ADDR = "127.0.0.6"


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % 500 + 3 for w in text.split()]


def jsonl(tmp_path, rows, name="prompts.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


def test_range_ratio_draws_lengths_in_vllms_interval_and_zero_keeps_them_fixed():
    w = WorkloadConfig(input_len=100, output_len=32, range_ratio=0.5)
    specs = build_requests(w, 200, tokenize, seed=3)
    ins, outs = [len(s.prompt_ids) for s in specs], [s.max_tokens for s in specs]
    assert min(ins) >= 50 and max(ins) <= 150 and len(set(ins)) > 40
    assert min(outs) >= 16 and max(outs) <= 48 and len(set(outs)) > 20
    assert [len(s.prompt_ids) for s in build_requests(w, 200, tokenize, seed=3)] == ins
    assert "100-token prompts ±50%, drawn per request; 32 output tokens ±50%" in w.describe()
    fixed = build_requests(WorkloadConfig(input_len=100, output_len=32), 20, tokenize, seed=3)
    assert {(len(s.prompt_ids), s.max_tokens) for s in fixed} == {(100, 32)}
    with pytest.raises(ValueError, match="range_ratio"):
        WorkloadConfig(range_ratio=1.0)


def test_a_custom_jsonl_is_sent_as_written(tmp_path):
    rows = [{"prompt": f"question {i} " + "word " * i, "output_tokens": 3 + i} for i in range(6)]
    rows[2].pop("output_tokens")
    w = WorkloadConfig(dataset=str(jsonl(tmp_path, rows)), output_len=7)
    specs = build_requests(w, 6, tokenize, seed=1)
    sent = {tuple(s.prompt_ids): s.max_tokens for s in specs}
    assert w.describe(False).startswith(f"prompts and output lengths from {w.dataset}")
    assert sent == {tuple(tokenize(r["prompt"])): r.get("output_tokens", 7) for r in rows}
    again = build_requests(w, 6, tokenize, seed=2)
    assert [s.prompt_ids for s in again] != [s.prompt_ids for s in specs]  # its own order
    # the mixed runs keep their own shape
    mixed = build_requests(w.model_copy(update={"mixed_long_len": 40, "mixed_long_every": 2}),
                           4, tokenize, mixed=True, seed=1)
    assert [len(s.prompt_ids) for s in mixed] == [40, 128, 40, 128]


def test_a_run_never_repeats_a_prompt_and_a_long_one_is_refused_with_its_line(tmp_path):
    w = WorkloadConfig(dataset=str(jsonl(tmp_path, [{"prompt": "a b c"}, {"prompt": "d " * 50}])),
                       output_len=8)
    with pytest.raises(LabError, match="has 2 prompts and one run sends 3"):
        build_requests(w, 3, tokenize)
    with pytest.raises(LabError, match=r"line 2: 50 prompt \+ 8 output tokens do not fit the model's context \(40 "):
        build_requests(w, 2, tokenize, max_model_len=40)


@pytest.mark.parametrize(("lines", "where", "what"), [
    (['{"prompt": "a"}', '{"prompt": "b"', '{"prompt": "c"}'], "line 2", "not JSON"),
    (['{"prompt": "a"}', '{"text": "b"}'], "line 2", "field 'prompt'"),
    (['{"prompt": "  "}'], "line 1", "field 'prompt'"),
    (['{"prompt": "a", "output_tokens": 0}'], "line 1", "field 'output_tokens' is 0"),
    (['{"prompt": "a", "output_tokens": "5"}'], "line 1", "field 'output_tokens' is '5'"),
    (['{"prompt": "a", "output_tokens": true}'], "line 1", "field 'output_tokens' is True"),
    (['["prompt"]'], "line 1", "not a JSON object"),
    ([""], "whole file", "no prompts"),
])
def test_a_bad_jsonl_is_refused_with_the_line_and_the_field(tmp_path, lines, where, what):
    p = jsonl(tmp_path, lines)
    with pytest.raises(LabError) as e:
        read_dataset(p)
    assert f"{p}, {where}: {what}" in str(e.value) and "nothing was sent" in str(e.value)


def test_sharegpt_takes_the_first_turn_and_the_replys_length(tmp_path):
    data = [{"conversations": [{"from": "human", "value": "hello there"},
                               {"from": "gpt", "value": "one two three four"}]},
            {"conversations": [{"from": "human", "value": "alone"}]},
            {"conversations": [{"from": "human", "value": "why"},
                               {"from": "gpt", "value": "because"}, {"from": "human", "value": "ok"}]}]
    p = tmp_path / "share.json"
    p.write_text(json.dumps(data))
    rows, short = read_dataset(p)
    assert short == 1 and [r.line for r in rows] == [1, 3]
    specs = build_requests(WorkloadConfig(dataset=str(p)), 2, tokenize, seed=0)
    assert sorted((len(s.prompt_ids), s.max_tokens) for s in specs) == [(1, 1), (2, 4)]
    p.write_text(json.dumps([{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt"}]}]))
    with pytest.raises(LabError, match="entry 1: turn 2's field 'value'"):
        read_dataset(p)
    p.write_text(json.dumps({"conversations": []}))
    with pytest.raises(LabError, match="top level: a ShareGPT file is a JSON list"):
        read_dataset(p)


@pytest.fixture
def word_tokenizer(tmp_path):
    """A model directory with a whitespace word-level tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *(f"w{i}" for i in range(200))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    d = tmp_path / "model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    return d, vocab


def test_bench_sends_what_the_file_says_and_refuses_a_bad_file_before_sending(tmp_path,
                                                                                word_tokenizer):
    model, vocab = word_tokenizer
    rows = [{"prompt": " ".join(f"w{(i * 7 + j) % 200}" for j in range(5 + i)),
             "output_tokens": 2 + i % 3} for i in range(12)]
    data = jsonl(tmp_path, rows)
    log = tmp_path / "sent.jsonl"
    port = free_port(ADDR)
    url = f"http://{ADDR}:{port}"
    pid, ticks = spawn_until_up([sys.executable, "-m", "lab_utils.bench.stub_server", ADDR,
                                 str(port), "1", "1", str(log)], f"{url}/v1/completions")
    try:
        out = tmp_path / "bench.json"
        assert cli.main(["bench", "--url", url, "--out", str(out), "--dataset", str(data),
                         "--tokenizer", str(model), "--concurrency", "2", "--num-prompts", "10",
                         "--warmup", "2", "--repeats", "1"]) == 0
        sent = [tuple(json.loads(x)["prompt"]) for x in log.read_text().splitlines()]
        wanted = {tuple(vocab[w] for w in r["prompt"].split()): r["output_tokens"] for r in rows}
        assert len(sent) == 12 and len(set(sent)) == 12 and set(sent) == set(wanted)
        records = json.loads(out.read_text())["payload"]["points"][0]["requests"]
        assert len(records) == 10
        assert all(r["max_tokens"] == wanted[tuple(vocab[w] for w in
                   next(q["prompt"] for q in rows if len(q["prompt"].split()) == r["prompt_len"]
                        ).split())] for r in records)
        assert all(r["completion_tokens"] == r["max_tokens"] for r in records)
        log.unlink()
        bad = jsonl(tmp_path, ['{"prompt": "w1"}', '{"prompt": 5}'], "bad.jsonl")
        assert cli.main(["bench", "--url", url, "--out", str(out), "--dataset", str(bad),
                         "--tokenizer", str(model), "--concurrency", "1"]) == 2
        assert not log.exists()  # nothing was sent
    finally:
        stop_group(pid, ticks, 5)
