"""What the notebooks store: the typed records, one payload model per notebook, and the
results files that carry them from one notebook to the next. It imports only `config`,
`on_node`, `util` and `errors`, so the code that measures, serves and reports builds on it.

- `store`: the results envelope, writing (atomic, the previous file to history/) and
  loading (typed, or an error naming the notebook to re-run); another run's results as a
  reference.
- `hardware`: the software versions and machine facts every envelope records.
- `payloads`: each notebook's payload (`PAYLOADS`).
- the records the payloads hold: `checklist` (a check's result), `sweep` (a request, a
  load point, a sweep), `forecast` (01's engine profile, a forecast), `kv_transfer`
  (notebook 02's probe, predictions and recommendation), `proof` (04's proof of transfer).
- `calibration`: what real starts measured per node (the plan's estimates replaced).
- `points`: the typed measured point (`Point`, one `Measured` per metric), the one metric
  table (`METRICS`) and the one rule for "this differs" (`compare`, `differs`).
"""

from lab_utils.results.hardware import hardware_facts, software_versions
from lab_utils.results.payloads import (
    PAYLOADS,
    BaselinePayload,
    CollectiveRow,
    DisaggregatedPayload,
    EnvironmentPayload,
    FrontDoors,
    Instance,
    KvRecommendation,
    KvTransferPayload,
    Payload,
    Proof,
    ProofRow,
    Reference,
    ReplicatedPayload,
    Roofline,
    SameOutputRow,
    ServingPayload,
    TensorParallelPayload,
    collective_said,
    fell_back,
)
from lab_utils.results.points import COMPARED, METRICS, Measured, Point, compare, differs
from lab_utils.results.store import (
    RESULTS,
    SCHEMA_VERSION,
    ResultsEnvelope,
    ResultsSpec,
    load_envelope,
    load_optional,
    load_reference,
    load_reference_results,
    load_results,
    reference_note,
    reference_origin,
    results_spec,
    write_envelope,
    write_results,
)

__all__ = [
    "COMPARED", "METRICS", "Measured", "Point", "compare", "differs",
    "PAYLOADS", "RESULTS", "SCHEMA_VERSION", "BaselinePayload", "CollectiveRow", "DisaggregatedPayload",
    "EnvironmentPayload", "FrontDoors", "Instance", "KvRecommendation", "KvTransferPayload",
    "Payload", "Proof", "ProofRow", "Reference", "ReplicatedPayload", "ResultsEnvelope",
    "ResultsSpec", "Roofline", "SameOutputRow", "ServingPayload", "TensorParallelPayload", "collective_said", "fell_back", "hardware_facts", "load_envelope",
    "load_optional", "load_reference", "load_reference_results", "load_results",
    "reference_note", "reference_origin", "results_spec", "software_versions",
    "write_envelope", "write_results",
]
