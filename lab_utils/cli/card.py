"""`card`: a one-page card per pair; connects to nothing."""

from __future__ import annotations

import sys

from lab_utils.config import jupyter_token, load_config
from lab_utils.notebook import print_card, require_card


def run(args) -> int:
    sources = args.configs or [args.config]
    for i, source in enumerate(sources):
        cfg = load_config(source)
        require_card(cfg)  # before a token is made for it
        token = jupyter_token(cfg)  # made here on first use: the pair's, printed on its card
        if i:
            print("\f")  # a page break between pairs when printed
        where = {k: v for k, v in (("checkout", args.checkout), ("reference", args.reference))
                 if v}  # else the card's own defaults
        print_card(cfg, token, **where)
        print(f"{cfg.profile}: its JupyterLab token is in {cfg.jupyter_token_path()}; copy it "
              f"to the same path on {cfg.notebook_host() or 'its notebook host'} (for the user "
              "that runs `make jupyter`) so the card's URL opens it", file=sys.stderr)
    return 0
