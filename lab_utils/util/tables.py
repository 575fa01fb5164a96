"""How notebooks show pandas tables."""

from __future__ import annotations


def whole_tables() -> None:
    """Show a notebook's tables whole: every cell's full text (a verdict or a basis cut at
    50 characters cannot be checked) and every row up to 200 (a sentence that counts over
    a table's rows is checked against them all)."""
    import pandas as pd

    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_rows", 200)
