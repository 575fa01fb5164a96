"""What the notebooks call: the front door they import (`from lab_utils import notebook as
lab`), one call per step.
Each module says in its docstring which steps it holds.

Modules inside import each other, never this front door.
"""

from lab_utils.forecast.profile import profile_frame
from lab_utils.kv.budget import kv_buffer_device
from lab_utils.notebook import hood, lessons, transfer_lesson
from lab_utils.notebook.agenda import start_lines, timetable
from lab_utils.notebook.card import print_card, require_card
from lab_utils.notebook.compare import (
    compare_frame,
    compare_front_doors,
    compare_policies,
    sweep_frame,
    versus_reference,
)
from lab_utils.notebook.environment import record_environment, require_environment
from lab_utils.notebook.forecasting import (
    eta_inputs,
    eta_lines,
    grade_forecast,
    make_forecast,
    predict,
)
from lab_utils.notebook.hood import protocol_by_hand, watch_scheduler
from lab_utils.notebook.kv_lesson import explain_kv
from lab_utils.notebook.record import record_baseline, record_disaggregated, record_replicated
from lab_utils.notebook.session import ServingSession, tokenizer_of
from lab_utils.notebook.sharded import (
    prove_split,
    record_tensor_parallel,
    require_same_output,
    same_output_frame,
    start_tensor_parallel,
)
from lab_utils.notebook.steps import (
    cache_meter,
    check_alive,
    conclude,
    conclude_transfer,
    decode_roofline,
    nixl_threads_frame,
    plot_decode_roofline,
    profile_engine,
    proof_frame,
    proof_record,
    prove_kv_transfer,
    reference_outputs,
    run_sweep,
    single_request,
)
from lab_utils.notebook.switches import two_switches
from lab_utils.notebook.time_split import time_instances, where_time_went
from lab_utils.notebook.timings import (
    optional_lines,
    optional_seconds,
    read_timings,
    whole_notebook_lines,
)
from lab_utils.notebook.triage import triage_text
from lab_utils.results.guesses import guess, guesses_frame
from lab_utils.util.tables import whole_tables

whole_tables()  # the notebooks show their tables whole (`util.tables.whole_tables`)

__all__ = [
    "ServingSession", "cache_meter", "check_alive", "compare_frame", "compare_front_doors", "compare_policies",
    "conclude", "conclude_transfer", "decode_roofline", "eta_inputs", "eta_lines",
    "explain_kv",
    "grade_forecast", "guess", "print_card", "triage_text", "guesses_frame", "hood", "kv_buffer_device", "lessons", "make_forecast",
    "nixl_threads_frame", "plot_decode_roofline", "predict", "profile_engine", "profile_frame", "proof_frame",
    "proof_record", "protocol_by_hand", "prove_kv_transfer", "record_baseline",
    "record_disaggregated", "record_environment", "record_replicated", "reference_outputs",
    "require_environment", "run_sweep", "single_request", "sweep_frame", "tokenizer_of",
    "time_instances", "transfer_lesson", "two_switches", "versus_reference", "watch_scheduler", "where_time_went",
    "whole_notebook_lines", "optional_lines", "prove_split", "record_tensor_parallel", "require_same_output",
    "same_output_frame", "start_tensor_parallel", "require_card", "start_lines", "timetable",
    "optional_seconds", "read_timings",
]
