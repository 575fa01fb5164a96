"""The benchmark report of notebook 05, computed from the results of notebooks 00-04.

- `data`: loading the results into one `ReportData` (only 01 is required).
- `tables`: the pandas tables; `points_table` is the one everything is computed from.
- `conclusions`: who wins what, only where the lab's one rule says the two differ
  (`lab_utils.results.points.compare`), as claims (`lab_utils.results.claims`).
- `expected`: this run's figures beside those expected on two DGX Sparks.
- `forecast`: 03's and 04's forecasts graded, the forecast for two Sparks, the what-if.
- `when_pd`: when prefill/decode pays on two and on four Sparks, by prompt/output ratio, ITL
  SLO and split (a forecast from published figures).
- `plots`: matplotlib figures (Agg canvas, pyplot never touched).
- `summary`: the first screen (`verdict`: the verdict in one sentence), the CPU rehearsal's banner,
  the system under test.
- `sections`: the report as a list of blocks, in reading order.
- `export`: every run as a CSV row and as a `vllm bench serve --save-result` JSON file.
- `render`: `build_report(cfg)` writes report.html, report.md, plots/*.png and export/,
  and the report's claims into claims.json.
- `audit`: every saved claim checked against the results files, every result sentence of
  the executed notebooks and the report looked up among them (`python -m lab_utils audit`).
"""

from lab_utils.report.audit import Audit, audit
from lab_utils.report.conclusions import Conclusions, compare, conclusions
from lab_utils.report.data import ReportData, load_report_data, run_hint
from lab_utils.report.expected import EXPECTED_TWO_SPARK, expected_figures
from lab_utils.report.export import fields_table, runs_frame, write_exports
from lab_utils.report.forecast import forecast_grades, spark_forecast, what_if
from lab_utils.report.plots import PLOT_NAMES, Plot, plot_values, render_plots, write_plots
from lab_utils.report.render import ReportPaths, build_report, render_html, render_markdown
from lab_utils.report.sections import Block, report_blocks, verdict_table
from lab_utils.report.summary import REHEARSAL_BANNER, system_under_test, workloads_text
from lab_utils.report.tables import (
                                      display_table,
                                      headline_table,
                                      kv_table,
                                      points_table,
)
from lab_utils.report.verdict import verdict_sentence
from lab_utils.report.when_pd import show_when_pd_pays
from lab_utils.results.points import COMPARED as METRICS
from lab_utils.results.points import MARGIN
from lab_utils.util.numbers import fmt_num
from lab_utils.util.tables import whole_tables

whole_tables()  # the notebooks that import the report show its tables whole

__all__ = [
    "Audit", "audit",
    "EXPECTED_TWO_SPARK", "MARGIN", "METRICS", "PLOT_NAMES", "REHEARSAL_BANNER", "Block", "Conclusions",
    "Plot", "ReportData", "ReportPaths", "build_report", "compare", "conclusions",
    "display_table", "expected_figures", "fields_table", "fmt_num", "forecast_grades", "headline_table", "kv_table",
    "load_report_data", "plot_values", "points_table", "render_html", "render_markdown",
    "render_plots", "report_blocks", "run_hint", "runs_frame", "spark_forecast", "system_under_test",
    "show_when_pd_pays", "verdict_sentence", "verdict_table", "workloads_text", "what_if", "write_exports", "write_plots",
]
