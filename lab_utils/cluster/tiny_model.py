"""Generate the rehearsal profile's tiny Llama model, with no download.

The CPU rehearsal needs a model whose greedy output depends on the whole prompt (so a
wrong KV transfer shows up as different tokens) yet loads in seconds. This builds one: a
byte-level BPE tokenizer trained with `tokenizers` on a seeded synthetic corpus, and a
4-layer Llama with seeded random weights saved as bf16 safetensors, plus the config,
generation config and a chat template. The same seed gives the same bytes; generation is
skipped when the directory already holds a model made with the same recipe. The recipe
file marks the directory as the lab's: a directory without it that is not empty is
someone else's and is never replaced.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from lab_utils.errors import LabError
from lab_utils.on_node import dirs

RECIPE_VERSION = 1
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODEL_SHAPE: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    # Wider than the usual 0.02 so greedy output varies with context instead of
    # collapsing to one repeated token.
    initializer_range=0.1,
)
MARKER = "tiny_model_recipe.json"

# Syllables compose pseudo-words so the corpus (and the prompts built from it) is varied
# without shipping a dictionary.
_SYLLABLES = ["ka", "lo", "mi", "ner", "sta", "qu", "ion", "tra", "vel", "pre", "fill", "de", "code", "cache", "blo", "ck", "tok", "en", "spa", "rk", "nix", "gra", "dient", "lat", "ency", "thr", "ough", "put", "mem", "ory", "band", "width", "no", "de", "lin", "k", "rai", "l", "por", "t"]


def words(rng: random.Random, n: int) -> list[str]:
    """`n` pseudo-words drawn from `rng`."""
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def _recipe(seed: int) -> dict:
    return {"recipe": RECIPE_VERSION, "seed": seed, "vocab": VOCAB_SIZE, "shape": MODEL_SHAPE}


def _build_tokenizer(seed: int, out: Path) -> dict[str, int | None]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    corpus = [" ".join(words(rng, 40)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": SPECIAL_TOKENS[0],
                "eos_token": SPECIAL_TOKENS[1],
                "pad_token": SPECIAL_TOKENS[2],
                "add_bos_token": False,
                "model_max_length": MODEL_SHAPE["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    return ids


def _build_weights(seed: int, out: Path, ids: dict[str, int | None]) -> None:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        bos_token_id=ids[SPECIAL_TOKENS[0]],
        eos_token_id=ids[SPECIAL_TOKENS[1]],
        pad_token_id=ids[SPECIAL_TOKENS[2]],
        **MODEL_SHAPE,
    )
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) hides the bound signature
    model.save_pretrained(out, safe_serialization=True)
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def is_current(out_dir: Path, seed: int = 0) -> bool:
    marker = Path(out_dir) / MARKER
    try:
        return json.loads(marker.read_text()) == _recipe(seed)
    except (OSError, ValueError):
        return False


def generate(out_dir: str | Path, seed: int = 0, force: bool = False) -> Path:
    """Write the tiny model into `out_dir` (built aside, then moved in place)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One generator at a time: a second caller waits, then finds the model current.
    with open(out_dir.parent / f".{out_dir.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current(out_dir, seed):
            return out_dir
        if dirs.owner(str(out_dir), MARKER) == "other":
            raise LabError(_not_ours(out_dir))
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".tiny-") as tmp:
            build = Path(tmp) / "model"
            build.mkdir()
            ids = _build_tokenizer(seed, build)
            _build_weights(seed, build, ids)
            (build / MARKER).write_text(json.dumps(_recipe(seed)))
            if dirs.replace(str(build), str(out_dir), MARKER) == "other":
                raise LabError(_not_ours(out_dir))
    return out_dir


def _not_ours(out_dir: Path) -> str:
    return (f"{out_dir} exists and is not a tiny model the lab generated (it is not empty "
            f"and has no {MARKER}); the lab replaces only what it made. Choose another "
            "directory (model.path in the config), or remove that one yourself if it is yours.")


def fingerprint(model_dir: str | Path) -> str:
    """SHA-256 over the model's files (names and bytes): same snapshot, same value."""
    h = hashlib.sha256()
    for f in sorted(Path(model_dir).rglob("*")):
        if f.is_file():
            h.update(f.relative_to(model_dir).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()
