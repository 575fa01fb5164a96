"""Predict, then measure: the forecast of replicated and disaggregated serving.

- `profile`: the curves notebook 01 measures on its instance (prefill, decode step, proxy hop);
- `model`: the discrete-event model of engines, proxy and KV transfer that predicts from them;
- `inputs`: the model's inputs from 01's and 02's results, or from published GB10 figures;
- `run`: the forecast notebooks 03 and 04 print and record before they measure;
- `grade`: the forecast against what was measured, as the report shows it.
"""
