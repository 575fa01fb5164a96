"""`jupyter`: JupyterLab on the notebook host's address, with a token."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.runner import serve_jupyter


def run(args) -> int:
    return serve_jupyter(load_config(args.config), args.notebooks_dir)
