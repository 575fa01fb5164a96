"""Results files: each notebook writes one JSON file under `results/<profile>/`, in one
envelope (`ResultsEnvelope`: schema version, kind, notebook, UTC time, profile, config,
software, hardware and the notebook's own `payload`), and later notebooks read it. The
payload is the notebook's model (`payloads.PAYLOADS`): `write_results` takes
it, `load_results` gives it back typed. Writes are atomic (temp file, fsync, rename) and
keep the previous file under `history/`; loading says which notebook to (re-)run when a
file is missing, corrupt, from another profile, another notebook or a newer lab. The
envelope's software and hardware facts come from `hardware`.
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Literal, NamedTuple, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from lab_utils.config import LabConfig
from lab_utils.errors import LabError, ResultsMissingError
from lab_utils.results.hardware import hardware_facts, software_versions
from lab_utils.results.payloads import (
    PAYLOADS,
    BaselinePayload,
    DisaggregatedPayload,
    EnvironmentPayload,
    KvTransferPayload,
    ReplicatedPayload,
    TensorParallelPayload,
)
from lab_utils.util.atomic import atomic_write_text

SCHEMA_VERSION = 1


class ResultsSpec(NamedTuple):
    notebook: str
    file_name: str
    notebook_file: str

    @property
    def kind(self) -> str:
        return Path(self.file_name).stem


RESULTS: dict[str, ResultsSpec] = {
    "00": ResultsSpec("00", "environment.json", "00_Environment_Setup.ipynb"),
    "01": ResultsSpec("01", "baseline_metrics.json", "01_Local_Inference_Baseline.ipynb"),
    "02": ResultsSpec("02", "kv_transfer_metrics.json", "02_KV_Cache_Transfer.ipynb"),
    "03": ResultsSpec("03", "replicated_metrics.json", "03_Replicated_Serving.ipynb"),
    "04": ResultsSpec("04", "disaggregated_metrics.json", "04_Disaggregated_Serving.ipynb"),
    # 04's optional section: one model across the nodes
    "tp": ResultsSpec("tp", "tensor_parallel_metrics.json", "04_Disaggregated_Serving.ipynb"),
}


def results_spec(notebook: str | int) -> ResultsSpec:
    """The registry entry of a notebook ("01", "1" or 1)."""
    key = f"{int(notebook):02d}" if str(notebook).isdigit() else str(notebook)
    if key not in RESULTS:
        raise LabError(f"unknown notebook {notebook!r}: choose one of {', '.join(RESULTS)}")
    return RESULTS[key]


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


P = TypeVar("P")


class ResultsEnvelope(BaseModel, Generic[P]):
    """One results file. `ResultsEnvelope[BaselinePayload]` and so on for the notebooks'
    files; a file of another kind (e.g. `python -m lab_utils bench`) has a dict payload."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    kind: str
    notebook: str
    timestamp: str  # ISO 8601, UTC
    profile: str
    config: dict[str, Any]
    software: dict[str, Any]
    hardware: dict[str, Any]
    payload: P
    # set on a copy loaded with `load_reference`: another run's results standing in for this
    # profile's ({"source": directory, "profile": its profile, "timestamp": when it was written})
    reference: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def _iso_timestamp(cls, value: str) -> str:
        _parse_time(value)  # ValueError if not ISO 8601
        return value


def _clean(value: Any) -> Any:
    """NaN and ±inf become None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def _archive(path: Path) -> None:
    """Copy a results file to history/<stem>.<its timestamp>.json (mtime if unreadable)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        stamp = _parse_time(json.loads(text)["timestamp"])
    except Exception:
        stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    stem = f"{path.stem}.{stamp.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}"
    base = path.parent / "history" / stem
    target, n = base.with_name(base.name + ".json"), 1
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}-{n}.json")
    atomic_write_text(target, text)


def write_results(
    cfg: LabConfig,
    notebook: str,
    payload: BaseModel,
    *,
    software: dict[str, Any] | None = None,
    hardware: dict[str, Any] | None = None,
) -> Path:
    """Write a notebook's results (its payload model, `payloads.PAYLOADS[notebook]`) in the
    envelope; the previous file goes to history/."""
    spec = results_spec(notebook)
    model = PAYLOADS[spec.notebook]
    if not isinstance(payload, model):
        raise LabError(f"notebook {spec.notebook}'s results are a {model.__module__}."
                       f"{model.__name__}, not a {type(payload).__name__}: build the model "
                       "(not a dict) and write that")
    return write_envelope(cfg, cfg.results_dir / spec.file_name, spec.kind, spec.notebook,
                          payload, software=software, hardware=hardware)


def write_envelope(
    cfg: LabConfig,
    path: str | os.PathLike,
    kind: str,
    notebook: str,
    payload: BaseModel | dict[str, Any],
    *,
    software: dict[str, Any] | None = None,
    hardware: dict[str, Any] | None = None,
) -> Path:
    """Write `payload` (a model, or a dict for files no notebook reads) in the envelope to
    any path (atomically; old file to history/)."""
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    kind_of = type(payload) if isinstance(payload, BaseModel) else dict[str, Any]
    envelope = ResultsEnvelope[kind_of](  # type: ignore[valid-type]  # parametrized at run time
        schema_version=SCHEMA_VERSION,
        kind=kind,
        notebook=notebook,
        timestamp=now.replace("+00:00", "Z"),
        profile=cfg.profile,
        config=cfg.snapshot(),
        software=software_versions() if software is None else software,
        hardware=hardware_facts() if hardware is None else hardware,
        payload=payload,
    )
    text = json.dumps(_clean(envelope.model_dump()), indent=2, sort_keys=False, allow_nan=False)
    path = Path(path)
    if path.exists():
        _archive(path)
    atomic_write_text(path, text + "\n")
    return path


def _rerun(spec: ResultsSpec | None) -> str:
    if spec is None:
        return "re-run the notebook that writes it"
    n, file = spec.notebook_file[:2], spec.notebook_file
    return f"re-run notebooks/{file} (or `python -m lab_utils run --from {n} --to {n}`)"


def _problems(e: ValidationError, prefix: str = "", limit: int = 5) -> str:
    errors = [(".".join(map(str, (prefix, *er["loc"]) if prefix else er["loc"])) or "(top level)",
               er["msg"]) for er in e.errors()]
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(f"{where}: {msg}" for where, msg in errors[:limit]) + more


def _load(path: Path, spec: ResultsSpec | None) -> ResultsEnvelope:
    """The envelope validated, its payload still a dict."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}: {e.msg}"
        raise ResultsMissingError(f"{path}: not valid JSON ({where}); {_rerun(spec)}") from None
    except RecursionError:
        raise ResultsMissingError(f"{path}: not a results file (nested too deep to read); "
                                  f"{_rerun(spec)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsMissingError(f"{path}: cannot read ({e}); {_rerun(spec)}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LabError(
            f"{path}: written with results schema {version}, but this lab knows only up to "
            f"{SCHEMA_VERSION}; update the lab (git pull, then reinstall) to read it"
        )
    try:
        return ResultsEnvelope[dict[str, Any]].model_validate(data)
    except ValidationError as e:
        msg = f"{path}: not a valid results file ({_problems(e)}); {_rerun(spec)}"
        raise ResultsMissingError(msg) from None


def _typed(path: Path, envelope: ResultsEnvelope, spec: ResultsSpec) -> ResultsEnvelope:
    """The envelope with its payload validated as notebook `spec`'s model."""
    if envelope.kind != spec.kind:
        raise ResultsMissingError(
            f"{path} holds {envelope.kind!r} results (notebook {envelope.notebook!r}), not "
            f"notebook {spec.notebook}'s {spec.kind!r}; {_rerun(spec)}")
    model = PAYLOADS[spec.notebook]
    try:
        payload = model.model_validate(envelope.payload)
    except ValidationError as e:
        raise ResultsMissingError(
            f"{path}: not notebook {spec.notebook}'s results as this lab reads them "
            f"({_problems(e, 'payload')}); {_rerun(spec)}") from None
    fields = {k: getattr(envelope, k) for k in ResultsEnvelope.model_fields if k != "payload"}
    return ResultsEnvelope[model](**fields, payload=payload)  # type: ignore[valid-type]  # parametrized at run time


def load_envelope(path: str | os.PathLike) -> ResultsEnvelope:
    """Load and validate any results file; a notebook's file (known by its kind) comes back
    with its payload typed, any other with a dict payload. The notebook to re-run is
    guessed from the file's name."""
    path = Path(path)
    envelope = _load(path, next((s for s in RESULTS.values() if s.file_name == path.name), None))
    spec = next((s for s in RESULTS.values() if s.kind == envelope.kind), None)
    return envelope if spec is None else _typed(path, envelope, spec)


@overload
def load_results(cfg: LabConfig, notebook: Literal["00"]) -> ResultsEnvelope[EnvironmentPayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: Literal["01"]) -> ResultsEnvelope[BaselinePayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: Literal["02"]) -> ResultsEnvelope[KvTransferPayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: Literal["03"]) -> ResultsEnvelope[ReplicatedPayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: Literal["04"]) -> ResultsEnvelope[DisaggregatedPayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: Literal["tp"]) -> ResultsEnvelope[TensorParallelPayload]: ...
@overload
def load_results(cfg: LabConfig, notebook: str) -> ResultsEnvelope: ...


def load_results(cfg: LabConfig, notebook: str) -> ResultsEnvelope:
    """The results a notebook wrote for this profile, its payload typed (`PAYLOADS`), or
    an error saying how to get them."""
    spec = results_spec(notebook)
    path = cfg.results_dir / spec.file_name
    if not path.exists():
        n, file = spec.notebook_file[:2], spec.notebook_file
        raise ResultsMissingError(
            f"results of notebook {n} not found at {path}: run notebooks/{file} first "
            f"(or `python -m lab_utils run --from {n} --to {n}`)"
        )
    envelope = _load(path, spec)
    if envelope.profile != cfg.profile:
        raise ResultsMissingError(
            f"{path} was written for profile {envelope.profile!r}, but the current profile is "
            f"{cfg.profile!r}; {_rerun(spec)} with the current profile"
        )
    if envelope.reference and (str(path), envelope.timestamp) not in _SAID:
        _SAID.add((str(path), envelope.timestamp))
        print(reference_note(spec.notebook, envelope.reference), flush=True)
    return _typed(path, envelope, spec)


_SAID: set[tuple[str, str]] = set()  # reference notes already printed by this process


def reference_origin(ref: dict[str, Any]) -> str:
    """Where a reference run's results came from, in words."""
    return (f"profile {ref.get('profile')!r}, written {ref.get('timestamp')}, "
            f"loaded from {ref.get('source')}")


def reference_note(notebook: str, ref: dict[str, Any]) -> str:
    return (f"NOTE: notebook {notebook}'s results here are a REFERENCE run's, not this "
            f"cluster's ({reference_origin(ref)}); run notebook {notebook} to replace them")


def load_reference(cfg: LabConfig, source: str | os.PathLike, fill: bool = True) -> list[str]:
    """Load another run's results (a results directory, e.g. the rehearsal's
    results/local-cpu or a pair's from the day before): each notebook's file is copied to
    `reference/` in this profile's results, for the notebooks' "yours vs reference", and
    (`fill`) into the results themselves where this profile has none, labelled as the
    reference's, so a later notebook can run without the earlier ones having run here.
    Returns what it did, a line per file."""
    src = Path(source)
    if not src.is_dir():
        raise LabError(f"{src}: not a directory of results (give e.g. results/local-cpu)")
    done = []
    for spec in RESULTS.values():
        path = src / spec.file_name
        if not path.exists():
            continue
        envelope = _typed(path, _load(path, spec), spec)
        ref = envelope.reference or {"source": str(src.resolve()), "profile": envelope.profile,
                                     "timestamp": envelope.timestamp}
        copy = envelope.model_copy(update={"profile": cfg.profile, "reference": ref})
        text = json.dumps(_clean(copy.model_dump()), indent=2, allow_nan=False) + "\n"
        atomic_write_text(cfg.results_dir / "reference" / spec.file_name, text)
        here = cfg.results_dir / spec.file_name
        if fill and not here.exists():
            atomic_write_text(here, text)
            done.append(f"{spec.notebook}: {spec.file_name} from {src} (labelled as reference)")
        else:
            done.append(f"{spec.notebook}: {spec.file_name} kept as reference only"
                        + (" (this profile has its own)" if here.exists() else ""))
    if not done:
        raise LabError(f"{src}: no notebook results found there")
    return done


def load_reference_results(cfg: LabConfig, notebook: str) -> ResultsEnvelope | None:
    """The reference run's results of `notebook` (`load_reference`), if loaded."""
    spec = results_spec(notebook)
    path = cfg.results_dir / "reference" / spec.file_name
    return _typed(path, _load(path, spec), spec) if path.exists() else None


def load_optional(cfg: LabConfig, notebook: str) -> ResultsEnvelope | None:
    """A notebook's results if it wrote them for this profile; None if it has not (a
    broken or foreign file still raises, naming the notebook to re-run)."""
    if not (cfg.results_dir / results_spec(notebook).file_name).exists():
        return None
    return load_results(cfg, notebook)
