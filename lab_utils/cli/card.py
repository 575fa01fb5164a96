"""`card`: a one-page card per pair; connects to nothing."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.notebook import print_card


def run(args) -> int:
    sources = args.configs or [args.config]
    for i, source in enumerate(sources):
        if i:
            print("\f")  # a page break between pairs when printed
        print_card(load_config(source))
    return 0
