"""The per-program timelines a sweep recorded (``splitlab sweep --timelines``): one long-format table beside the rows.

A session with ``--timelines`` launches every work-list point that passed its check and was timed once more with
its timeline on (``bench.worker``; ``kernels.timeline`` says what a record holds) and journals the records in the
same line as the point's row (``"timeline": {"fields": [...], "partial": [[...], ...], "merge": [...]}``), so a
row and its records are written together or not at all. ``timelines.parquet`` in the sweep folder is rebuilt from
the journals with ``results.parquet`` (``refresh``): one row per record, ``KEY_COLUMNS`` then the record's fields in
the order the journal names them (``program``, ``sm``, ``start_ns``, ``end_ns``, ``slot``, ``group``, ``item``,
``items``: ``kernels.timeline.FIELDS``), int64, ``-1`` where a field was not measured (no clock under Triton's
interpreter). A point's records are those journalled with the row that ``results.best_rows`` keeps for it (the
same session), so a resumed sweep, whose rows are never doubled, holds one record set a point; a point without a
work-list kernel (a split-count point, a peer) has none. Records that only the Parquet holds (a
finished sweep whose journals were removed) are kept; a Parquet that cannot be read is moved aside
(``timelines.parquet.damaged-<time>``, with a warning) and rebuilt from the journals.

``load(folder)`` reads the table (the Parquet when it was built from the journals as they are now, else the
journals); ``records(folder, point_id)`` gives one point's records as ``kernels.timeline.Timelines.read`` does (what
``splitlab.ledger.ledger`` takes). Pure pandas; no torch.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pandas as pd

from splitlab import results
from splitlab.errors import SplitlabError

#: The table's file in a sweep folder.
FILE = "timelines.parquet"
#: The columns that say whose record a row is (the fields follow): the device and point (``results.KEY``), the
#: session that recorded it, and the kernel (``partial`` or ``merge``).
KEY_COLUMNS = (*results.KEY, "session", "kernel")


def _frame(parts: list[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=list(KEY_COLUMNS))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)


def _payload_frame(row: dict, payload: object, where: str) -> pd.DataFrame:
    """One point's journalled records as rows of the table; ``SplitlabError`` naming ``where`` if malformed."""
    fields = payload.get("fields") if isinstance(payload, dict) else None
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise SplitlabError(f"{where}: a timeline whose fields are {fields!r:.80}; expected a list of names")
    parts = []
    for kernel, recs in payload.items():
        if kernel == "fields":
            continue
        if not isinstance(recs, list) or not all(isinstance(r, list) and len(r) == len(fields) for r in recs):
            raise SplitlabError(f"{where}: the {kernel!r} records of a timeline are not lists of {len(fields)} "
                                "values; expected one list a program")
        df = pd.DataFrame(recs, columns=fields, dtype="int64")
        for i, c in enumerate(KEY_COLUMNS):
            df.insert(i, c, pd.Series([kernel if c == "kernel" else row.get(c)] * len(df), dtype="string"))
        parts.append(df)
    return _frame(parts)


def from_journals(sweep_dir: Path, rows: pd.DataFrame) -> tuple[pd.DataFrame, set[tuple[str, str]]]:
    """The records journalled with ``rows`` (a sweep's rows, one a point: ``results.rebuild``'s), and the (device,
    point_id) of every point some journal holds records for. Damaged journal lines are skipped here (reading the
    rows already refused or listed them)."""
    cols = rows[[*results.KEY, "session"]].astype(object)
    kept = {(r["device"], r["point_id"]): r["session"] for r in cols.where(cols.notna(), None).to_dict("records")}
    found: dict[tuple[str, str], pd.DataFrame] = {}
    journalled: set[tuple[str, str]] = set()
    for j in results.journals(sweep_dir):
        for ev in results.read_journal(j, []):
            row = ev.get("row")
            if ev.get("event") != "row" or "timeline" not in ev or not isinstance(row, dict):
                continue
            key = (row.get("device"), row.get("point_id"))
            journalled.add(key)
            if kept.get(key) == row.get("session"):
                found[key] = _payload_frame(row, ev["timeline"], f"{j}: point {row.get('point_id')}")
    return _frame(list(found.values())), journalled


def rebuild(sweep_dir: Path, rows: pd.DataFrame) -> pd.DataFrame:
    """The table of a sweep folder whose rows are ``rows``: the journals' records (``from_journals``) and those of
    the folder's ``timelines.parquet`` for points no journal holds records for."""
    sweep_dir = Path(sweep_dir)
    df, journalled = from_journals(sweep_dir, rows)
    path = sweep_dir / FILE
    if path.is_file():
        try:
            old = _read(path)
        except SplitlabError as e:
            warnings.warn(f"{e}; reading the timelines from the journals (records only it held are lost)",
                          stacklevel=2)
            old = pd.DataFrame()
        if len(old):
            keep = [(d, p) not in journalled for d, p in zip(old["device"], old["point_id"], strict=True)]
            df = _frame([df, old[keep]])
    return df


def refresh(sweep_dir: Path, rows: pd.DataFrame, journal_sizes: dict[str, int]) -> pd.DataFrame:
    """Rebuild ``timelines.parquet`` (written whole, then renamed, with the journal sizes it was built from, as
    ``results.write_parquet`` writes); returns the table. Nothing is written for a sweep without records."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / FILE
    if path.is_file():
        try:
            _read(path)
        except SplitlabError as e:
            aside = path.with_name(f"{FILE}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            os.replace(path, aside)
            warnings.warn(f"{e}; moved to {aside.name}, rebuilt from the journals", stacklevel=2)
    df = rebuild(sweep_dir, rows)
    if len(df) or path.is_file():
        results.write_parquet(df, sweep_dir / FILE, journal_sizes=journal_sizes)
    return df


def _read(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # ArrowInvalid, OSError, ...: whatever pyarrow makes of damaged bytes
        raise SplitlabError(f"{path}: not a readable Parquet file ({type(e).__name__}); expected a sweep's "
                            "timelines (move it aside: the journals rebuild it)") from None
    missing = [c for c in KEY_COLUMNS if c not in df.columns]
    if missing:
        raise SplitlabError(f"{path}: no {', '.join(missing)} column; expected a sweep's timelines")
    return df


def load(sweep_dir: str | Path, point_id: str | None = None) -> pd.DataFrame:
    """A sweep folder's timeline table (the module docstring), or one point's rows of it (``point_id``): empty
    where nothing was recorded. The Parquet when it was built from the journals as they are now, else rebuilt
    from them (``results.sweep_frame``'s rule)."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").is_file():
        raise SplitlabError(f"path={str(sweep_dir)!r} is not allowed; expected a sweep folder (with sweep.json)")
    path, js = sweep_dir / FILE, results.journals(sweep_dir)
    df = None
    if path.is_file():
        try:
            built_from = results.parquet_meta(path).get("journals")
        except SplitlabError:
            built_from = None  # damaged: read from the journals (rebuild says so where they cannot stand alone)
        if not js or built_from == {j.name: j.stat().st_size for j in js}:
            df = _read(path)
    if df is None:
        df = rebuild(sweep_dir, results.sweep_frame(sweep_dir)) if js else _frame([])
    if point_id is not None:
        df = df[df["point_id"] == point_id].reset_index(drop=True)
    return df


def records(sweep_dir: str | Path, point_id: str) -> dict[str, list[dict[str, int]]]:
    """One point's records by kernel (``partial``, ``merge``), each a dict of the record's fields, in program order:
    the form ``kernels.timeline.Timelines.read`` returns and ``splitlab.ledger.ledger`` takes ({} if none)."""
    df = load(sweep_dir, point_id)
    fields = [c for c in df.columns if c not in KEY_COLUMNS]
    out: dict[str, list[dict[str, int]]] = {}
    for kernel, part in df.groupby("kernel", sort=False):
        part = part.sort_values("program") if "program" in fields else part
        out[str(kernel)] = [{f: int(v) for f, v in zip(fields, r, strict=True)}
                            for r in part[fields].itertuples(index=False)]
    return out


__all__ = ["FILE", "KEY_COLUMNS", "from_journals", "load", "rebuild", "records", "refresh"]
