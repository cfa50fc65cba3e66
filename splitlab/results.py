"""Sweep results: the versioned schema, reading any number of sweeps into one DataFrame, CSV export.

One row per measured point (``COLUMNS``; ``REQUIRED`` are the columns every schema-1 row has). A sweep
folder (made by ``splitlab sweep``) holds::

    sweep.json                 the sidecar: sweep id, card, grid, timer, the environment of every session
    journal-<session>.jsonl    what each session did, one JSON object a line, fsynced (the source of truth)
    results.parquet            the rows, rebuilt from the journals (deduplicated by point_id); a finished
                               sweep may drop its journals: the Parquet then holds everything
    results.csv                the same, for eyes

``load(path, ...)`` takes sweep folders, folders holding sweep folders, Parquet files, journals or the names
of catalogued sets (``load("h200")``, ``splitlab.catalog``); it reads a sweep's Parquet when it is up to date
with the journals, else the journals, and refuses data of a schema version it does not know.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

SCHEMA_VERSION = 1
SUPPORTED_SCHEMAS = (1,)
STATUSES = ("ok", "wrong", "error", "skipped")

#: Every column and its pandas dtype (nullable types: a knob an implementation lacks is <NA>).
COLUMNS: dict[str, str] = {
    "schema_version": "Int64",
    "sweep_id": "string",
    "point_id": "string",
    "kernel": "string",
    "impl": "string",
    "kind": "string",
    "batch": "Int64",
    "num_q_heads": "Int64",
    "num_kv_heads": "Int64",
    "head_dim_qk": "Int64",
    "head_dim_v": "Int64",
    "ctx_len": "Int64",
    "page_size": "Int64",
    "topk": "Int64",
    "dtype": "string",
    "num_splits": "Int64",
    "block_n": "Int64",
    "block_k": "Int64",
    "block_h": "Int64",
    "num_warps": "Int64",
    "num_stages": "Int64",
    "ctas": "Int64",  # CTAs of the partial launch (launch facts, not measured)
    "waves": "float64",  # ctas / SMs of the sweep's device (one CTA per SM)
    "timing": "string",  # graph | events | fake (fake: modelled, NOT a measurement)
    "p20_us": "float64",
    "p50_us": "float64",
    "p80_us": "float64",
    "n_samples": "Int64",
    "kv_bytes": "Int64",  # unique KV bytes one call reads
    "gbps": "float64",  # kv_bytes / p50
    "rel_err": "float64",  # ||out - ref|| / ||ref|| against the fp64 reference
    "status": "string",  # ok | wrong | error | skipped
    "error": "string",  # why, when not ok
    # Beyond the required set:
    "planners": "string",  # comma-separated planners whose choice this point is ("" for grid-only points)
    "in_grid": "boolean",  # the grid asked for this point (not only a planner)
    "grid": "string",
    "device": "string",  # the device preset/GPU the points were planned and timed for
    "sm_count": "Int64",
    "timing_detail": "string",  # e.g. "cuda-graph x43 rotated"
    "session": "string",  # the session (journal) that produced the row; its environment is in sweep.json
    "elapsed_s": "float64",  # wall time of the point: check, compile, timing
    "finished_at": "string",
    # Where the point ran (absent, i.e. <NA>, in data written before they were recorded):
    "host": "string",
    "gpu_index": "Int64",  # the host's GPU index (nvidia-smi's numbering when CUDA_VISIBLE_DEVICES lists indices)
    "gpu_uuid": "string",
}
REQUIRED = tuple(list(COLUMNS)[: list(COLUMNS).index("error") + 1])
WORKLOAD_COLUMNS = ("kind", "batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len",
                    "page_size", "topk", "dtype")
PARQUET_META_KEY = b"splitlab"


class SchemaError(SplitlabError):
    """Result data this splitlab cannot read (unknown schema version, missing columns)."""


# --- journals -----------------------------------------------------------------------------------------------

def read_journal(path: Path) -> list[dict]:
    """The events of one journal. A torn last line (the process died while writing it) is ignored; a bad
    line anywhere else is an error."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no newline after it: torn by a kill mid-write
                break
            raise SplitlabError(f"{path}: line {i + 1} is not JSON; the journal is damaged") from None
    return events


def journals(sweep_dir: Path) -> list[Path]:
    """A sweep's journals, oldest session first (session ids start with a UTC timestamp)."""
    return sorted(Path(sweep_dir).glob("journal-*.jsonl"))


@dataclass
class SweepState:
    """What a sweep's journals say: ``rows`` (first finished row per point_id, in the order they finished),
    ``starts`` (point_id -> (journal, skeleton row) of every start), ``abandoned`` (point_id -> times a
    session was stopped from outside while on it), ``sessions`` (the session headers)."""

    rows: list[dict] = field(default_factory=list)
    starts: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)
    abandoned: dict[str, int] = field(default_factory=dict)
    sessions: list[dict] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0

    @property
    def finished(self) -> set[str]:
        return {r["point_id"] for r in self.rows}


def sweep_state(sweep_dir: Path) -> SweepState:
    """Read every journal of a sweep folder."""
    st = SweepState()
    seen: set[str] = set()
    for j in journals(sweep_dir):
        st.sizes[j.name] = j.stat().st_size
        for ev in read_journal(j):
            kind = ev.get("event")
            if kind == "session":
                st.sessions.append(ev)
            elif kind == "start":
                st.starts.setdefault(ev["point_id"], []).append((j.name, ev.get("row", {})))
            elif kind == "abandon":
                st.abandoned[ev["point_id"]] = st.abandoned.get(ev["point_id"], 0) + 1
            elif kind == "row":
                pid = ev["row"]["point_id"]
                if pid in seen:
                    st.duplicates += 1
                    continue
                seen.add(pid)
                st.rows.append(ev["row"])
    return st


# --- frames -------------------------------------------------------------------------------------------------

def _check_versions(versions: Iterable[object], where: object) -> None:
    for v in set(versions):
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            raise SchemaError(f"{where}: rows without a schema_version; expected schema_version="
                              f"{SCHEMA_VERSION}")
        if int(v) not in SUPPORTED_SCHEMAS:
            raise SchemaError(f"{where}: schema_version={int(v)} is not allowed; expected one of "
                              f"{', '.join(map(str, SUPPORTED_SCHEMAS))} (this splitlab's result schema; data "
                              "from a newer splitlab needs that version to read it)")


def frame(rows: list[dict], *, where: object = "rows") -> pd.DataFrame:
    """Rows -> a DataFrame with ``COLUMNS`` first, in their dtypes (extra keys kept after them)."""
    _check_versions((r.get("schema_version") for r in rows), where)
    df = pd.DataFrame(rows)
    return _typed(df, where)


def _typed(df: pd.DataFrame, where: object) -> pd.DataFrame:
    missing = [c for c in REQUIRED if c not in df.columns]
    if len(df) and missing:
        raise SchemaError(f"{where}: columns {', '.join(missing)} are missing; expected every column of "
                          f"schema_version={SCHEMA_VERSION}")
    for c, dtype in COLUMNS.items():
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), dtype=dtype)
        else:
            col = df[c]
            if dtype == "float64":
                col = pd.to_numeric(col, errors="coerce")
            df[c] = col.astype(dtype)
    return df[list(COLUMNS) + [c for c in df.columns if c not in COLUMNS]].reset_index(drop=True)


def write_parquet(df: pd.DataFrame, path: Path, *, journal_sizes: dict[str, int] | None = None) -> None:
    """Write ``df`` atomically (a temporary file, then a rename), with the schema version and the journal
    sizes it was built from in the file's metadata."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[PARQUET_META_KEY] = json.dumps({"schema_version": SCHEMA_VERSION, "journals": journal_sizes}).encode()
    table = table.replace_schema_metadata(meta)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def parquet_meta(path: Path) -> dict:
    """The splitlab metadata of a Parquet file ({} if it has none)."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(PARQUET_META_KEY)
    return json.loads(raw) if raw else {}


def _read_parquet(path: Path) -> pd.DataFrame:
    meta = parquet_meta(path)
    if "schema_version" in meta:
        _check_versions([meta["schema_version"]], path)
    df = pd.read_parquet(path)
    if "schema_version" not in df.columns:
        raise SchemaError(f"{path}: no schema_version column; expected splitlab results "
                          f"(schema_version={SCHEMA_VERSION})")
    _check_versions(df["schema_version"].dropna().unique().tolist() or [SCHEMA_VERSION], path)
    return _typed(df, path)


def rebuild(sweep_dir: Path) -> tuple[pd.DataFrame, SweepState]:
    """A sweep folder's rows rebuilt from its journals (the first finished row per point_id), plus the rows of
    its Parquet that no journal holds (so a folder whose journals were deleted keeps its data); and the
    journals' state as read (``sizes`` for the Parquet's metadata, the sessions for the sidecar)."""
    sweep_dir = Path(sweep_dir)
    st = sweep_state(sweep_dir)
    df = frame(st.rows, where=sweep_dir)
    pq_path = sweep_dir / "results.parquet"
    if pq_path.is_file():
        old = _read_parquet(pq_path)
        extra = old[~old["point_id"].isin(df["point_id"])]
        if len(extra):
            df = pd.concat([df, extra], ignore_index=True) if len(df) else extra.reset_index(drop=True)
    return df, st


def sweep_frame(sweep_dir: Path) -> pd.DataFrame:
    """One sweep folder's rows: its Parquet when that was built from the journals as they are now (or there
    are no journals), else ``rebuild``."""
    sweep_dir = Path(sweep_dir)
    pq_path = sweep_dir / "results.parquet"
    js = journals(sweep_dir)
    if pq_path.is_file():
        built_from = parquet_meta(pq_path).get("journals")
        if not js or built_from == {j.name: j.stat().st_size for j in js}:
            return _read_parquet(pq_path)
    if not js:
        raise SplitlabError(f"{sweep_dir}: no results.parquet and no journal; expected a sweep folder")
    return rebuild(sweep_dir)[0]


def _sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if (path / "sweep.json").is_file():
        return [path]
    if path.is_dir():
        sweeps = sorted(p.parent for p in path.rglob("sweep.json"))
        loose = sorted(p for p in path.rglob("*.parquet")
                       if not any(s == p.parent or s in p.parents for s in sweeps))
        return sweeps + loose
    raise SplitlabError(f"path={str(path)!r} is not allowed; expected a sweep folder, a folder of sweeps, a "
                        ".parquet file or a journal")


def load(*paths: str | Path) -> pd.DataFrame:
    """Read any number of sweeps (folders, folders of folders, Parquet files, journals, or the name of a set or a
    role in the catalog, ``splitlab.catalog``: ``load("h200")``, ``load("confirm")``) into one DataFrame.

    Refuses (``SchemaError``) data of a schema version this splitlab does not know. Rows are unique per
    (sweep_id, point_id)."""
    from splitlab import catalog

    if not paths:
        raise SplitlabError("load() needs at least one path")
    frames = []
    for p in [src for x in paths for src in catalog.sources(x)]:
        srcs = _sources(p)
        if not srcs:
            raise SplitlabError(f"{p}: no sweep results under it (no sweep.json, no .parquet)")
        for s in srcs:
            if s.is_dir():
                frames.append(sweep_frame(s))
            elif s.suffix == ".parquet":
                frames.append(_read_parquet(s))
            elif s.suffix == ".jsonl":
                rows = [e["row"] for e in read_journal(s) if e.get("event") == "row"]
                frames.append(frame(rows, where=s))
            else:
                raise SplitlabError(f"path={str(s)!r} is not allowed; expected a sweep folder, .parquet or .jsonl")
    frames = [f for f in frames if len(f)]
    if not frames:
        return _typed(pd.DataFrame(columns=list(COLUMNS)), "empty")
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(subset=["sweep_id", "point_id"], keep="first").reset_index(drop=True)


def to_csv(df_or_paths: pd.DataFrame | str | Path, out: str | Path) -> Path:
    """Export results (a DataFrame, or a path ``load`` takes) as CSV."""
    df = df_or_paths if isinstance(df_or_paths, pd.DataFrame) else load(df_or_paths)
    out = Path(out)
    df.to_csv(out, index=False)
    return out


def workload(row: dict | pd.Series) -> DecodeWorkload:
    """The ``DecodeWorkload`` of a result row (uniform lengths), e.g. to ask a planner after the fact."""
    return DecodeWorkload(**{c: (row[c].item() if hasattr(row[c], "item") else row[c]) for c in WORKLOAD_COLUMNS})
