"""The command line's argument types: each refuses what its command cannot use, with the
form it wants."""

from __future__ import annotations

import argparse

import httpx


def gib(text: str) -> float:
    """A memory size in GiB a node could have (finite, above 0, at most 64 TiB)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 65536:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a memory size in GiB (0 to 65536)")
    return value


def notebook_number(text: str) -> str:
    """A notebook's number as its file names start (`3` is `03`); anything else refused."""
    if not text.isdigit() or len(text) > 2:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a notebook number: give 00 to 05")
    return text.zfill(2)


def floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(x) for x in text.split(",") if x.strip()]


def levels(text: str) -> str:
    """A comma-separated list of positive finite numbers (checked; kept as text)."""
    try:
        ok = all(0 < v < float("inf") for v in floats(text) or [float("nan")])
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a comma-separated list of "
                                         "positive numbers, e.g. 1,4,16")
    return text


def base_url(text: str) -> str:
    """An http(s) base URL httpx can reach (scheme, host, a valid port)."""
    try:
        url = httpx.URL(text)
        ok = url.scheme in ("http", "https") and bool(url.host)
    except (httpx.InvalidURL, ValueError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not an http:// or https:// base URL, "
                                         "e.g. http://127.0.0.4:8000")
    return text

