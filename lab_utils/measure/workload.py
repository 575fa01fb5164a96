"""Benchmark workloads: seeded prompts with an exact number of tokens.

Prompts are pseudo-text cut to exactly `input_len` tokens of the served model's own
tokenizer, either the local `tokenizer.json` or the server's `/tokenize` endpoint (so a
hub model needs no local copy), and sent as token ids. Output length is fixed with
`ignore_eos`; `range_ratio` draws each request's lengths around the configured ones, and
`dataset` takes prompts from a file instead (`measure.dataset`). The mixed workload puts
one long prompt among every `mixed_long_every` requests, to show long prefills
interfering with decode. Same seed, same prompts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import httpx

from lab_utils.config import WorkloadConfig
from lab_utils.errors import LabError
from lab_utils.measure.dataset import DatasetRow, read_dataset
from lab_utils.measure.loadgen import RequestSpec, auth_headers
from lab_utils.measure.prompts import exact_prompt, load_tokenizer

Tokenize = Callable[[str], list[int]]


def local_tokenizer(model_dir: str) -> tuple[Tokenize, Callable[[list[int]], str]]:
    tok = load_tokenizer(model_dir)
    return (lambda text: tok.encode(text, add_special_tokens=False).ids), tok.decode


def server_tokenizer(url: str, model: str, api_key: str | None = None
                     ) -> tuple[Tokenize, Callable[[list[int]], str]]:
    """Tokenize with the served model's tokenizer through vLLM's /tokenize endpoint."""
    client = httpx.Client(base_url=url.rstrip("/"), timeout=60, headers=auth_headers(api_key))

    def post(path: str, body: dict) -> dict:
        r = client.post(path, json={"model": model, **body})
        if r.status_code != 200:
            raise LabError(f"{url}{path} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    return (lambda text: post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"],
            lambda ids: post("/detokenize", {"tokens": ids})["prompt"])


def _around(length: int, ratio: float, rng: random.Random) -> int:
    """`length`, or with a range ratio one drawn uniformly from [floor(L(1-r)), ceil(L(1+r))]
    (at least 1), the interval `vllm bench serve --random-range-ratio` draws from."""
    if not ratio:
        return length
    return rng.randint(max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio)))


def build_requests(w: WorkloadConfig, n: int, tokenize: Tokenize,
                   detokenize: Callable[[list[int]], str] | None = None, *,
                   mixed: bool = False, seed: int | None = None,
                   max_model_len: int | None = None) -> list[RequestSpec]:
    """`n` requests of the workload (plus nothing else: warm-up takes the first ones). With
    `workload.dataset`, the standard runs take the file's prompts (`from_dataset`); the
    mixed runs keep their own shape."""
    rng = random.Random(w.seed if seed is None else seed)
    if w.dataset and not mixed:
        return from_dataset(w, n, tokenize, rng, max_model_len)
    if mixed and not w.mixed_long_len:
        raise LabError("workload.mixed_long_len is not set: the mixed workload needs a long prompt length")
    specs = []
    for i in range(n):
        long = bool(mixed and w.mixed_long_len and i % w.mixed_long_every == 0)
        length = w.long_len if long else _around(w.input_len, w.range_ratio, rng)
        out = w.output_len if long else _around(w.output_len, w.range_ratio, rng)
        ids = exact_prompt(tokenize, length, rng)
        text = detokenize(ids) if (w.chat and detokenize) else None
        specs.append(RequestSpec(ids, out, text))
    return specs


def dataset_sample(w: WorkloadConfig, n: int, rng: random.Random) -> list[DatasetRow]:
    """The `n` rows of `workload.dataset` one run sends, in its order (`from_dataset`)."""
    assert w.dataset is not None  # the caller's condition
    rows, _ = read_dataset(w.dataset)
    if n > len(rows):
        raise LabError(f"{w.dataset} has {len(rows)} prompts and one run sends {n} (warm-up "
                       "included): lower workload.num_prompts / warmup (--num-prompts, "
                       "--warmup), or use a longer file")
    return rng.sample(rows, n)


def from_dataset(w: WorkloadConfig, n: int, tokenize: Tokenize, rng: random.Random,
                 max_model_len: int | None = None) -> list[RequestSpec]:
    """`n` requests from `workload.dataset`, in an order shuffled by `rng` (each point and
    repeat has its own seed, as `vllm bench serve --seed` shuffles a custom file). A prompt
    is sent as the file has it, tokenized without special tokens; its output length is the
    row's `output_tokens`, a ShareGPT reply's length in tokens, else `workload.output_len`.
    Refused before anything is sent: a run that needs more prompts than the file has (one
    run never repeats a prompt: a repeat is a prefix-cache hit), and a request longer than
    `max_model_len`, with its line."""
    specs = []
    for row in dataset_sample(w, n, rng):
        ids = tokenize(row.prompt)
        out = row.output_tokens or (max(1, len(tokenize(row.reply))) if row.reply
                                    else w.output_len)
        if not ids or (max_model_len and len(ids) + out > max_model_len):
            raise LabError(f"{w.dataset}, line {row.line}: {len(ids)} prompt + {out} output "
                           f"tokens do not fit the model's context ({max_model_len} tokens, "
                           "vllm.max_model_len): shorten or drop that line")
        specs.append(RequestSpec(ids, out, row.prompt if w.chat else None))
    return specs
