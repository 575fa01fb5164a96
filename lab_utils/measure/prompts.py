"""Prompts with an exact number of tokens, made with the served model's own tokenizer.

Prompts are pseudo-words drawn from a seeded generator, encoded, and cut to the exact
length wanted, so they are sent as token ids and the server sees exactly that many
tokens. Use a new seed for prompts that must be fresh (never seen by an instance's
prefix cache).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from pathlib import Path

from lab_utils.cluster.tiny_model import words
from lab_utils.errors import LabError


def load_tokenizer(model_dir: str | Path):
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise LabError(f"no tokenizer.json in {model_dir}: is the model present on this host?")
    return Tokenizer.from_file(str(path))


def exact_prompt(tokenize: Callable[[str], list[int]], n_tokens: int, rng: random.Random) -> list[int]:
    """Exactly `n_tokens` token ids of pseudo-text, with any tokenize(text) -> ids."""
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenize(" ".join(words(rng, max(8, n_tokens - len(ids)))))
    return ids[:n_tokens]


def fresh_prompts(tokenizer, lengths: list[int], seed: int | None = None) -> tuple[list[list[int]], int]:
    """One prompt per length from a `tokenizers.Tokenizer`; returns (prompts, seed).
    No seed: a new random one."""
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    tokenize = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    return [exact_prompt(tokenize, n, rng) for n in lengths], seed
