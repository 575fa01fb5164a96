"""Benchmark workloads: seeded prompts with an exact number of tokens.

Prompts are pseudo-text cut to exactly `input_len` tokens of the served model's own
tokenizer, either the local `tokenizer.json` or the server's `/tokenize` endpoint (so a
hub model needs no local copy), and sent as token ids. Output length is fixed with
`ignore_eos`. The mixed workload puts one long prompt among every `mixed_long_every`
requests, to show long prefills interfering with decode. Same seed, same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx

from lab_utils.config import WorkloadConfig
from lab_utils.errors import LabError
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


def build_requests(w: WorkloadConfig, n: int, tokenize: Tokenize,
                   detokenize: Callable[[list[int]], str] | None = None, *,
                   mixed: bool = False, seed: int | None = None) -> list[RequestSpec]:
    """`n` requests of the workload (plus nothing else: warm-up takes the first ones)."""
    rng = random.Random(w.seed if seed is None else seed)
    if mixed and not w.mixed_long_len:
        raise LabError("workload.mixed_long_len is not set: the mixed workload needs a long prompt length")
    specs = []
    for i in range(n):
        length = (w.mixed_long_len if mixed and w.mixed_long_len and i % w.mixed_long_every == 0
                  else w.input_len)
        ids = exact_prompt(tokenize, length, rng)
        text = detokenize(ids) if (w.chat and detokenize) else None
        specs.append(RequestSpec(ids, w.output_len, text))
    return specs
