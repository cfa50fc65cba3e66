"""Sweep results: the versioned schema, reading any number of sweeps into one DataFrame, CSV export.

One row per measured point (``COLUMNS``; ``REQUIRED`` are the columns every schema-1 row has). A sweep
folder (made by ``splitlab sweep``) holds::

    sweep.json                 the sidecar: sweep id, card, grid, timer, the environment of every session
    journal-<session>.jsonl    what each session did, one JSON object a line, fsynced (the source of truth)
    results.parquet            the rows, rebuilt from the journals (one per point, ``best_rows``); a finished
                               sweep may drop its journals: the Parquet then holds everything
    results.csv                the same, for eyes
    timelines.parquet          with --timelines: the work-list points' per-program records (``sweep_timelines``)

``load(path, ...)`` takes sweep folders, folders holding sweep folders, Parquet files, journals or the names of
catalogued sets (``load("h200")``, ``splitlab.catalog``); it reads a sweep's Parquet when it is up to date with the
journals, else the journals, and refuses data of a schema version it does not know. Anything it cannot read (a
damaged Parquet, a journal line that is not an event, a value of the wrong type, a status outside ``STATUSES``) is
one ``SplitlabError`` naming the file. A sweep folder whose Parquet is damaged but which has journals is read from
the journals (with a warning: rows only the Parquet held are lost).

Identity. ``point_id`` names a *configuration* (kernel, implementation, workload, resolved knobs:
``bench.grid.point_id``) and is the same on every device on purpose: it is how one configuration's times are
compared across GPUs, and the ids of the shipped data stay valid. A *measurement* is a configuration on a
device: every merge and deduplication keys on ``KEY = (device, point_id)`` (``device``: the device the points
were planned and timed for), so two devices' sweeps of the same point never collide; ``load`` keeps rows
unique per (sweep_id, device, point_id), so a repeat sweep on the same device keeps its own rows.

Duplicates. Where one key has several rows (a point written twice, the same sweep read twice), ``best_rows``
keeps one, deterministically: ``ok`` over ``wrong`` over ``error`` over ``skipped`` (a ``wrong`` row never
hides an ``ok`` one), then the newest ``finished_at`` (rows without one count as oldest), then the row read
last (journals are read oldest session first).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import socket
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

from splitlab import catalog
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

SCHEMA_VERSION = 1
SUPPORTED_SCHEMAS = (1,)
STATUSES = ("ok", "wrong", "error", "skipped")  # also the order of preference among duplicates (best_rows)
#: What identifies a measurement (see the module docstring): ``point_id`` alone names a configuration.
KEY = ("device", "point_id")

#: Every column and its pandas dtype (nullable types: a knob an implementation lacks is <NA>); what each means and
#: its unit: ``DESCRIPTIONS``. The columns up to ``error`` are ``REQUIRED``, the rest were added later.
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
    "ctas": "Int64",
    "waves": "float64",
    "timing": "string",
    "p20_us": "float64",
    "p50_us": "float64",
    "p80_us": "float64",
    "n_samples": "Int64",
    "kv_bytes": "Int64",
    "gbps": "float64",
    "rel_err": "float64",
    "status": "string",
    "error": "string",
    "planners": "string",
    "in_grid": "boolean",
    "grid": "string",
    "device": "string",
    "sm_count": "Int64",
    "timing_detail": "string",
    "session": "string",
    "elapsed_s": "float64",
    "finished_at": "string",
    "host": "string",
    "gpu_index": "Int64",
    "gpu_uuid": "string",
    "length_dist": "string",
    "length_seed": "Int64",
    "ctx_mean": "float64",
    "ctx_max": "Int64",
    "scheduler": "string",
    "schedule_hash": "string",
    "sched_ctas": "Int64",
    "sched_items": "Int64",
    "partial_rows": "Int64",
    "busiest_keys": "Int64",
}
#: Every column's unit ("" where it has none) and meaning: ``splitlab schema`` prints them and docs/schema.md is
#: their Markdown (``schema_markdown``; a test holds the two equal and every column described).
DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "schema_version": ("", "the result schema the row was written in (`SCHEMA_VERSION`)"),
    "sweep_id": ("", "the sweep that wrote the row (its folder's `sweep.json` holds the card, grid, timer and the "
                     "environment of every session)"),
    "point_id": ("", "16 hex digits naming a configuration: sha1 of kernel, impl, the workload's fields and the "
                     "launch knobs; the same on every device (a measurement is keyed by `device` and `point_id`)"),
    "kernel": ("", "the kernel card's name (`kernels/<name>.toml`: `gqa_decode`, `mla_decode`, `sparse_mla_decode`, "
                   "or a peer's card such as `flashinfer_decode`)"),
    "impl": ("", "the implementation's label (the card's `impl.label`: `splitlab-triton`, `torch-sdpa-flash`, ...)"),
    "kind": ("", "the workload's family: `gqa` (paged GQA/MHA/MQA), `mla` (absorbed MLA), `sparse_mla` (top-k gather)"),
    "batch": ("requests", "requests in the call (`sparse_mla`: query tokens)"),
    "num_q_heads": ("heads", "query heads"),
    "num_kv_heads": ("heads", "KV heads (MLA: 1, the shared latent cache)"),
    "head_dim_qk": ("elements", "head dim of q and k (MLA: latent + rope, e.g. 512 + 64 = 576)"),
    "head_dim_v": ("elements", "head dim of v and of the output (MLA: the latent, e.g. 512)"),
    "ctx_len": ("keys", "keys per request (`sparse_mla`: the token pool the indices point into)"),
    "page_size": ("keys", "keys per page of the paged cache"),
    "topk": ("keys", "keys each query token gathers (`sparse_mla`; 0 for the other kinds)"),
    "dtype": ("", "the cache's dtype: `bf16`, `fp16` or `fp8_e4m3`"),
    "num_splits": ("splits", "split-K partitions of each request's keys (1: unsplit); `<NA>` where the "
                             "implementation has no such knob"),
    "block_n": ("keys", "key tile of the dense kernels (keys a program loads per step)"),
    "block_k": ("keys", "key tile of the sparse MLA kernel (gathered keys per step)"),
    "block_h": ("heads", "query-head rows of one program's tile (MLA, sparse MLA; GQA: its padded group)"),
    "num_warps": ("warps", "warps per CTA (Triton launch option)"),
    "num_stages": ("stages", "software-pipeline stages (Triton launch option)"),
    "ctas": ("CTAs", "CTAs of the partial (split) launch: a launch fact, not measured"),
    "waves": ("waves", "`ctas` / `sm_count`, one CTA per SM: how many waves the launch fills"),
    "timing": ("", "the timer: `graph` (CUDA-graph replay over rotated input sets), `events` (each call alone, L2 "
                   "flushed, CUDA events) or `fake` (modelled for CI: NOT a measurement)"),
    "p20_us": ("us", "20th percentile of the call's time over the samples"),
    "p50_us": ("us", "median time of one call (what regret and `gbps` use)"),
    "p80_us": ("us", "80th percentile of the call's time over the samples"),
    "n_samples": ("samples", "timing samples (graph: replays, each averaged over its rotated calls; events: calls)"),
    "kv_bytes": ("bytes", "unique KV bytes one call reads (`sparse_mla`: the gathered rows, once per token)"),
    "gbps": ("GB/s", "`kv_bytes` / `p50_us` (10^9 bytes per second)"),
    "rel_err": ("ratio", "norm(out - ref) / norm(ref) against the fp64 reference; above the dtype's tolerance the "
                         "point is `wrong` and not timed"),
    "status": ("", "`ok` (checked and timed), `wrong` (failed the check), `error` (raised, crashed or timed out) or "
                   "`skipped` (the implementation is unavailable here)"),
    "error": ("", "why, when `status` is not `ok`"),
    "planners": ("", "comma-separated planners whose choice this point is (`name@device` where a rule planned for "
                     "another device); empty for grid-only points"),
    "in_grid": ("", "the card's grid asked for this point (false: only a planner did)"),
    "grid": ("", "the card's named grid the sweep ran (`quick`, `default`, `seed`, ...)"),
    "device": ("", "the device preset the point was planned and timed for (`splitlab devices`)"),
    "sm_count": ("SMs", "SMs (CUs) of that device, as the sweep saw them"),
    "timing_detail": ("", "how the timer ran, e.g. `cuda-graph x43 rotated` (43 input sets in one graph)"),
    "session": ("", "the session (journal) that produced the row; its environment is in `sweep.json`"),
    "elapsed_s": ("s", "wall time of the point: check, compile and timing"),
    "finished_at": ("", "when the point finished: local time with UTC offset, `%Y-%m-%dT%H:%M:%S%z`"),
    "host": ("", "the host the point ran on (`<NA>` in data written before it was recorded)"),
    "gpu_index": ("", "the host's GPU index (nvidia-smi's numbering when CUDA_VISIBLE_DEVICES lists indices; "
                      "`<NA>` in older data)"),
    "gpu_uuid": ("", "the GPU's UUID (`<NA>` in older data)"),
    "length_dist": ("", "the distribution the batch's lengths were drawn from (`workloads.LENGTH_DISTS`): "
                        "`uniform`, every request `ctx_len` keys (`sparse_mla`: `topk` valid); `spreadN`, each "
                        "uniform on [longest / N, longest] with one the longest; `longtail`, `bimodal`, and "
                        "`serving-PROFILE` (a simulated server's steady-state batch, `serving`), each with one the "
                        "longest; `<NA>` in older data: uniform"),
    "length_seed": ("", "the seed of that draw (0 for `uniform`): `length_dist`, `length_seed` and the workload "
                        "columns rebuild the batch (`results.workload`)"),
    "ctx_mean": ("keys", "mean keys per request (`sparse_mla`: valid top-k per token); `<NA>` in older data"),
    "ctx_max": ("keys", "the longest request's keys (`sparse_mla`: the most valid top-k of a token), what the "
                        "planners see as one length per batch; `<NA>` in older data"),
    "scheduler": ("", "the scheduler whose schedule the point ran on the work-list kernel (`planners.schedulers.NAMES`,"
                      " the card's `scheduler` knob); empty for a split-count point (and in older data)"),
    "schedule_hash": ("", "16 hex digits naming the schedule that ran (`Schedule.digest`: lengths, CTA slots, items); "
                          "`<NA>` for a split-count point"),
    "sched_ctas": ("CTAs", "CTA slots of the schedule (per head group: `ctas` = this x the kv heads or head tiles); "
                           "`<NA>` for a split-count point"),
    "sched_items": ("items", "work items of the schedule (a request's key range on one slot); `<NA>` for a split-count "
                             "point"),
    "partial_rows": ("rows", "partial rows the schedule writes for the merge (the items of requests in more than one "
                             "item); `<NA>` for a split-count point"),
    "busiest_keys": ("keys", "keys the busiest CTA slot streams; `<NA>` for a split-count point"),
}
REQUIRED = tuple(list(COLUMNS)[: list(COLUMNS).index("error") + 1])


def schema_rows() -> list[dict[str, str]]:
    """One row per result column, in order: its name, pandas dtype, unit, whether every row has it (``REQUIRED``)
    and its meaning (``DESCRIPTIONS``)."""
    return [dict(column=c, dtype=t, unit=DESCRIPTIONS[c][0], required="yes" if c in REQUIRED else "",
                 meaning=DESCRIPTIONS[c][1]) for c, t in COLUMNS.items()]


def schema_markdown() -> str:
    """docs/schema.md: the result columns as a Markdown page (``splitlab schema --markdown`` prints it)."""
    lines = [
        "# Result schema",
        "",
        f"Schema version {SCHEMA_VERSION}: one row per measured point, in a sweep folder's `results.parquet`, "
        "`results.csv` and journals (docs/sweeps.md); `splitlab.results.load` reads them into one DataFrame with "
        "these columns. `required`: every row has it; the others may be `<NA>` in older data.",
        "",
        "Generated by `splitlab schema --markdown` from `COLUMNS` and `DESCRIPTIONS` in `splitlab/results.py` "
        "(`tests/test_schema.py` holds this file equal to that output).",
        "",
        "| column | type | unit | required | meaning |",
        "|---|---|---|---|---|",
    ]
    for r in schema_rows():
        cells = [f"`{r['column']}`", r["dtype"], r["unit"], r["required"], r["meaning"].replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
WORKLOAD_COLUMNS = ("kind", "batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len",
                    "page_size", "topk", "dtype")
#: The workload columns of a ragged batch's length distribution (``DecodeWorkload.length_dist``): absent from
#: data written before ragged batches, which is uniform.
LENGTH_COLUMNS = ("length_dist", "length_seed")
PARQUET_META_KEY = b"splitlab"


class SchemaError(SplitlabError):
    """Result data this splitlab cannot read (unknown schema version, missing columns)."""


def _why(e: BaseException) -> str:
    """``Type: first line`` of an exception, for a one-line message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


# --- temporary files ------------------------------------------------------------------------------------------

_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
#: ``.<target>.<pid>[@<host>][.<token>].tmp``: what ``tmp_path`` names (files written whole, then renamed); the
#: host is absent in files of older versions.
_TMP = re.compile(r"^\.(?P<target>results\.parquet|results\.csv|sweep\.json|timelines\.parquet"
                  r"|journal-[A-Za-z0-9_-]+\.jsonl)"
                  r"\.(?P<pid>\d+)"
                  r"(?:@(?P<host>[A-Za-z0-9_-]+))?(?:\.[0-9a-f]+)?\.tmp$")


#: ``errno`` values of a write that found no room: a full disk, a full quota, a file-size limit (``ulimit -f``).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_failed(e: OSError, where: Path, then: str) -> SplitlabError:
    """One line for a file that could not be written: which (the error's file, else ``where``), why, and ``then``
    (what was kept, how to go on)."""
    why = e.strerror or type(e).__name__
    hint = "the disk is full or a file-size limit (ulimit -f) was reached: make room" if e.errno in NO_ROOM else \
        "fix that"
    return SplitlabError(f"{e.filename or where}: cannot be written ({why}); {hint}, {then}")


def tmp_path(path: Path, token: str = "") -> Path:
    """Where to write ``path`` before renaming it into place: a hidden file beside it named for this process and
    host (``clean_stale_tmp`` removes those of dead processes)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}@{_HOST}{'.' + token if token else ''}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host may still run: False only when it is known to be gone (so what it left
    behind may be removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or a pid this system cannot have, or no way to tell): keep its files
    return True


def clean_stale_tmp(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the temporary files (``tmp_path``) in ``folder`` that a killed process left: those of this host
    whose process is gone (of a sweep's files, or with ``name``, of that file's). A file of another host (a sweep
    folder shared between machines) is left alone: its process may be alive there. Returns what was removed."""
    removed = []
    pattern = _TMP if name is None else re.compile(
        rf"^\.(?P<target>{re.escape(name)})\.(?P<pid>\d+)(?:@(?P<host>[A-Za-z0-9_-]+))?(?:\.[0-9a-f]+)?\.tmp$")
    try:
        names = [p for p in Path(folder).iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for p in names:
        m = pattern.match(p.name)
        if m is None or (m["host"] is not None and m["host"] != _HOST) or pid_alive(int(m["pid"])):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass  # gone already (another session cleaned it), or not ours to remove
    return removed


# --- the sidecar ----------------------------------------------------------------------------------------------

class DamagedFile(SplitlabError):
    """A file that cannot be read at all (not JSON, not an object, not Parquet); the message names it."""


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def read_sidecar(path: Path) -> dict | None:
    """A sweep's ``sweep.json``, checked: None if there is none; ``DamagedFile`` if it is not a JSON object;
    ``SchemaError`` for a schema version this splitlab does not know; ``SplitlabError`` naming the file and
    the field for a field of the wrong type (sweep_id, kernel, grid, timer: strings; the SM counts under
    ``device`` and ``env.device``: integers >= 1)."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DamagedFile(f"{path}: cannot be read ({e.strerror or _why(e)})") from None
    try:
        side = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DamagedFile(f"{path}: not JSON ({_why(e)})") from None
    if not isinstance(side, dict):
        raise DamagedFile(f"{path}: a JSON {type(side).__name__}; expected the sidecar object")
    if "schema_version" in side:
        _check_versions([side["schema_version"]], path)
    fix = ("edit it, or delete it and `splitlab sweep ... --resume` rebuilds it from the journals")

    def bad(field: str, v: object, expected: str) -> SplitlabError:
        return SplitlabError(f"{path}: {field}={v!r:.80} is not allowed; expected {expected} ({fix})")

    for k in ("sweep_id", "kernel", "grid", "timer"):
        if k in side and not (isinstance(side[k], str) and side[k]):
            raise bad(k, side[k], "a non-empty string")
    for k in ("device", "env", "card"):
        if k in side and not isinstance(side[k], dict):
            raise bad(k, side[k], "an object")
    env_dev = side.get("env", {}).get("device", {})
    if not isinstance(env_dev, dict):
        raise bad("env.device", env_dev, "an object")
    for where, d, nullable in (("device", side.get("device", {}), False), ("env.device", env_dev, True)):
        if "sm_count" in d and not (_positive_int(d["sm_count"]) or (nullable and d["sm_count"] is None)):
            raise bad(f"{where}.sm_count", d["sm_count"], "an integer >= 1" + (" or null" if nullable else ""))
        if "name" in d and not isinstance(d["name"], str):
            raise bad(f"{where}.name", d["name"], "a string")
    if "sessions" in side and not isinstance(side["sessions"], list):
        raise bad("sessions", side["sessions"], "a list")
    return side


# --- journals -----------------------------------------------------------------------------------------------

#: What a damaged journal's message suggests: the flag that keeps its good lines.
SKIP_BAD_LINES = ("the journal is damaged (`splitlab sweep CARD ... --resume --skip-bad-lines` sets it aside and "
                  "keeps its other lines)")


def _journal_events(path: Path, bad: list[tuple[int, str]] | None = None) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) of every line of a journal. A torn last line (the process died while writing
    it) is ignored; a bad line anywhere else is an error naming the file and line, or, given ``bad``, is added
    to it as (line number, why) and skipped."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SplitlabError(f"{path}: cannot be read ({e.strerror or _why(e)}); expected a sweep journal") from None
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond reason
            if i == len(lines) - 1:  # no newline after it: torn by a kill mid-write
                break
            if bad is None:
                raise SplitlabError(f"{path}: line {i + 1} is not JSON; {SKIP_BAD_LINES}") from None
            bad.append((i + 1, "not JSON"))
            continue
        yield i + 1, ev


def read_journal(path: Path, bad: list[tuple[int, str]] | None = None) -> list[dict]:
    """The events of one journal (JSON objects). A torn last line (the process died while writing it) is
    ignored; a bad line anywhere else, or one that is not an object, is an error (given ``bad``: recorded there
    and skipped, as ``_journal_events`` does)."""
    return [ev for _, ev in _numbered_events(path, bad)]


def _numbered_events(path: Path, bad: list[tuple[int, str]] | None = None) -> list[tuple[int, dict]]:
    events = []
    for line, ev in _journal_events(path, bad):
        if not isinstance(ev, dict):
            why = f"a JSON {type(ev).__name__}"
            if bad is None:
                raise SplitlabError(f"{path}: line {line} is {why}; expected an event (an object); {SKIP_BAD_LINES}")
            bad.append((line, why))
            continue
        events.append((line, ev))
    return events


def rewrite_journal(path: Path, drop: Iterable[int]) -> Path:
    """Rewrite the journal at ``path`` without the lines ``drop`` (1-based) and without a torn last line, whole or
    not at all; the damaged file is kept beside it as ``<name>.damaged-<UTC time>`` (not read as a journal).
    Returns that copy's path. Only for a journal no live session writes."""
    import shutil
    import time

    path = Path(path)
    drop = set(drop)
    lines = path.read_bytes().split(b"\n")
    kept = [x for i, x in enumerate(lines[:-1]) if i + 1 not in drop and x.strip()]  # lines[-1]: torn, or empty
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}")
    tmp = tmp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(x + b"\n" for x in kept))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(path, aside)
        except OSError:  # a file system without hard links: a copy
            shutil.copy2(path, aside)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return aside


def _point_problem(ev: dict) -> str | None:
    """What is wrong with a start/abandon/row event (its row, its point_id), or None."""
    kind = ev["event"]
    row = ev.get("row") if kind in ("row", "start") else None
    if kind in ("row", "start") and not isinstance(row, dict) and not (kind == "start" and row is None):
        return f"a {kind} event whose row is {type(row).__name__}; expected an object"
    pid = row.get("point_id") if kind == "row" else ev.get("point_id")
    if not isinstance(pid, str) or not pid:
        return f"a {kind} event with point_id={pid!r:.80}; expected a string"
    return None


def _point_event(path: Path, line: int, ev: dict) -> tuple[str, dict | None]:
    """The point_id of a start/abandon/row event, and its row (a row event's; a start's skeleton), checked."""
    problem = _point_problem(ev)
    if problem is not None:
        raise SplitlabError(f"{path}: line {line}: {problem}; {SKIP_BAD_LINES}")
    row = ev.get("row") if ev["event"] in ("row", "start") else None
    return (row.get("point_id") if ev["event"] == "row" else ev.get("point_id")), row


def journal_rows(path: Path) -> list[dict]:
    """The finished rows of one journal, in the order written (every one, duplicates included)."""
    out = []
    for line, ev in _numbered_events(path):
        if ev.get("event") == "row":
            out.append(_point_event(path, line, ev)[1])
    return out


def journals(sweep_dir: Path) -> list[Path]:
    """A sweep's journals, oldest session first (session ids start with a UTC timestamp)."""
    return sorted(Path(sweep_dir).glob("journal-*.jsonl"))


def _rank(row: dict) -> int:
    status = row.get("status")
    return STATUSES.index(status) if status in STATUSES else len(STATUSES)


def _when(row: dict) -> float:
    """``finished_at`` as a UTC timestamp (-inf when absent or unreadable: such a row counts as oldest)."""
    try:
        return datetime.strptime(row.get("finished_at"), "%Y-%m-%dT%H:%M:%S%z").timestamp()  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return -math.inf


def _prefer(new: dict, old: dict) -> bool:
    """True if ``new`` (read after ``old``) is the row to keep of the two (see ``best_rows``)."""
    return (_rank(new), -_when(new)) <= (_rank(old), -_when(old))


@dataclass
class SweepState:
    """What a sweep's journals say: ``rows`` (one finished row per point_id, ``best_rows``' choice, in the order
    the points first finished), ``starts`` (point_id -> (journal, skeleton row) of every start), ``abandoned``
    (point_id -> times a session was stopped from outside while on it), ``sessions`` (the session headers),
    ``sizes`` (journal -> bytes read), ``duplicates`` (rows beyond the first of a point), ``row_journals``
    (the journal each of ``rows`` came from) and ``row_lines`` (its line there); ``bad_lines`` (journal, line,
    why) the damaged lines skipped (read with ``skip_bad``)."""

    rows: list[dict] = field(default_factory=list)
    starts: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)
    abandoned: dict[str, int] = field(default_factory=dict)
    sessions: list[dict] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    row_journals: list[str] = field(default_factory=list)
    row_lines: list[int] = field(default_factory=list)
    bad_lines: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def finished(self) -> set[str]:
        return {r["point_id"] for r in self.rows}


def sweep_state(sweep_dir: Path, *, skip_bad: bool = False) -> SweepState:
    """Read every journal of a sweep folder (``SplitlabError`` naming the journal and line if one is damaged;
    with ``skip_bad`` the damaged lines are skipped and listed in ``bad_lines``). A sweep has one device, so
    point_id alone keys its rows here."""
    st = SweepState()
    at: dict[str, int] = {}
    for j in journals(sweep_dir):
        try:
            st.sizes[j.name] = j.stat().st_size
        except OSError as e:
            raise SplitlabError(f"{j}: cannot be read ({e.strerror or _why(e)}); expected a sweep journal") from None
        bad: list[tuple[int, str]] | None = [] if skip_bad else None
        for line, ev in _numbered_events(j, bad):
            kind = ev.get("event")
            if kind == "session":
                st.sessions.append(ev)
                continue
            if kind not in ("start", "abandon", "row"):
                continue  # an event this version does not use
            problem = _point_problem(ev)
            if problem is not None and bad is not None:
                bad.append((line, problem))
                continue
            pid, row = _point_event(j, line, ev)
            if kind == "start":
                st.starts.setdefault(pid, []).append((j.name, row or {}))
            elif kind == "abandon":
                st.abandoned[pid] = st.abandoned.get(pid, 0) + 1
            elif pid in at:
                st.duplicates += 1
                if _prefer(row, st.rows[at[pid]]):
                    st.rows[at[pid]], st.row_journals[at[pid]], st.row_lines[at[pid]] = row, j.name, line
            else:
                at[pid] = len(st.rows)
                st.rows.append(row)
                st.row_journals.append(j.name)
                st.row_lines.append(line)
        st.bad_lines += [(j.name, line, why) for line, why in sorted(bad or [])]
    return st


# --- frames -------------------------------------------------------------------------------------------------

def _check_versions(versions: Iterable[object], where: object) -> None:
    for v in set(versions):
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            raise SchemaError(f"{where}: rows without a schema_version; expected schema_version="
                              f"{SCHEMA_VERSION}")
        try:
            n = int(v)  # type: ignore[call-overload]
            if isinstance(v, bool) or n != v:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise SchemaError(f"{where}: schema_version={v!r} is not allowed; expected one of "
                              f"{', '.join(map(str, SUPPORTED_SCHEMAS))}") from None
        if n not in SUPPORTED_SCHEMAS:
            raise SchemaError(f"{where}: schema_version={n} is not allowed; expected one of "
                              f"{', '.join(map(str, SUPPORTED_SCHEMAS))} (this splitlab's result schema; data "
                              "from a newer splitlab needs that version to read it)")


def frame(rows: list[dict], *, where: object = "rows") -> pd.DataFrame:
    """Rows -> a DataFrame with ``COLUMNS`` first, in their dtypes (extra keys kept after them); ``SchemaError``
    naming ``where`` for rows this schema does not allow."""
    bad = next((r for r in rows if not isinstance(r, dict)), None)
    if bad is not None:
        raise SchemaError(f"{where}: a row that is a {type(bad).__name__}; expected an object")
    _check_versions((r.get("schema_version") for r in rows), where)
    try:
        df = pd.DataFrame(rows)
    except Exception as e:  # e.g. rows whose keys pandas cannot make columns of
        raise SchemaError(f"{where}: rows that do not make a table ({_why(e)})") from None
    return _typed(df, where)


def _convert(col: pd.Series, dtype: str) -> pd.Series:
    if dtype == "string" and col.dtype == object and (col.notna() & ~col.map(lambda x: isinstance(x, str))).any():
        raise TypeError("a value that is not a string")
    if dtype == "float64":
        col = pd.to_numeric(col, errors="raise")
    return col.astype(dtype)


def _column(col: pd.Series, name: str, dtype: str, where: object) -> pd.Series:
    """``col`` in ``dtype``; a value that does not fit is a ``SchemaError`` naming the column and the value."""
    try:
        return _convert(col, dtype)
    except Exception:
        for v in col.dropna().tolist():  # the first value that does not convert, for the message
            try:
                _convert(pd.Series([v], dtype=object), dtype)
            except Exception:
                raise SchemaError(f"{where}: column {name} holds {v!r:.80}; expected {dtype} values") from None
        raise SchemaError(f"{where}: column {name} (dtype {col.dtype}) cannot be read as {dtype}") from None


def _typed(df: pd.DataFrame, where: object) -> pd.DataFrame:
    if df.columns.duplicated().any() or not all(isinstance(c, str) for c in df.columns):
        raise SchemaError(f"{where}: column names that repeat or are not strings; expected one column each of "
                          f"schema_version={SCHEMA_VERSION}")
    missing = [c for c in REQUIRED if c not in df.columns]
    if len(df) and missing:
        raise SchemaError(f"{where}: columns {', '.join(missing)} are missing; expected every column of "
                          f"schema_version={SCHEMA_VERSION}")
    for c, dtype in COLUMNS.items():
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), dtype=dtype)
        else:
            df[c] = _column(df[c], c, dtype, where)
    # A row without a length distribution (data from before ragged batches) is a batch of equal lengths: said so,
    # so that shapes key on the distribution (``analysis.SHAPE``) without dropping those rows.
    df["length_dist"] = df["length_dist"].fillna("uniform")
    df["length_seed"] = df["length_seed"].fillna(0)
    df["scheduler"] = df["scheduler"].fillna("")  # a split-count point (data from before schedules too)
    bad = df["status"][~df["status"].isin(STATUSES)]
    if len(bad):
        v = bad.iloc[0]
        raise SchemaError(f"{where}: status={None if pd.isna(v) else v!r} is not allowed; expected one of "
                          f"{', '.join(STATUSES)}")
    for c in ("sweep_id", "point_id"):
        if df[c].isna().any():
            raise SchemaError(f"{where}: rows without a {c}; expected every row of schema_version="
                              f"{SCHEMA_VERSION} to have one")
    return df[list(COLUMNS) + [c for c in df.columns if c not in COLUMNS]].reset_index(drop=True)


def best_rows(df: pd.DataFrame, key: Iterable[str] = KEY) -> pd.DataFrame:
    """One row per ``key`` (default ``KEY``), deterministically: ``ok`` over ``wrong`` over ``error`` over
    ``skipped``, then the newest ``finished_at``, then the row that comes later in ``df``. Order kept; the
    number of rows dropped is in ``attrs["duplicates"]``."""
    key = list(key)
    if df.empty or not df.duplicated(key, keep=False).any():
        out = df.reset_index(drop=True)
        out.attrs["duplicates"] = 0
        return out
    rows = df[["status", "finished_at"]].astype(object).where(df[["status", "finished_at"]].notna(), None)
    rank = [(_rank(r), -_when(r)) for r in rows.to_dict("records")]
    order = sorted(range(len(df)), key=lambda i: (rank[i], -i))
    keep = (df.iloc[order].duplicated(key, keep="first")).to_numpy()
    chosen = sorted(i for i, dup in zip(order, keep, strict=True) if not dup)
    out = df.iloc[chosen].reset_index(drop=True)
    out.attrs["duplicates"] = len(df) - len(out)
    return out


def write_parquet(df: pd.DataFrame, path: Path, *, journal_sizes: dict[str, int] | None = None) -> None:
    """Write ``df`` atomically (a temporary file, then a rename; the temporary file is removed if the write
    fails or is interrupted), with the schema version and the journal sizes it was built from in the file's
    metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[PARQUET_META_KEY] = json.dumps({"schema_version": SCHEMA_VERSION, "journals": journal_sizes}).encode()
    table = table.replace_schema_metadata(meta)
    tmp = tmp_path(path)
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def parquet_meta(path: Path) -> dict:
    """The splitlab metadata of a Parquet file ({} if it has none); ``SplitlabError`` naming the file if it is
    not a readable Parquet file."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as e:  # ArrowInvalid, OSError, ...: whatever pyarrow makes of damaged bytes
        raise SplitlabError(f"{path}: not a readable Parquet file ({_why(e)}); expected splitlab results") from None
    raw = meta.get(PARQUET_META_KEY)
    if not raw:
        return {}
    try:
        out = json.loads(raw)
    except (ValueError, RecursionError):
        out = None
    if not isinstance(out, dict):
        raise SplitlabError(f"{path}: its splitlab metadata is not a JSON object; the file is damaged")
    return out


def _read_parquet(path: Path) -> pd.DataFrame:
    meta = parquet_meta(path)
    if "schema_version" in meta:
        _check_versions([meta["schema_version"]], path)
    try:
        df = pd.read_parquet(path)
    except Exception as e:
        raise SplitlabError(f"{path}: not a readable Parquet file ({_why(e)}); expected splitlab results") from None
    if "schema_version" not in df.columns:
        raise SchemaError(f"{path}: no schema_version column; expected splitlab results "
                          f"(schema_version={SCHEMA_VERSION})")
    _check_versions(df["schema_version"].dropna().unique().tolist() or [SCHEMA_VERSION], path)
    return _typed(df, path)


def parquet_damage(path: Path) -> str | None:
    """Why a Parquet file cannot be read as splitlab results (None if it can); a schema version this splitlab
    does not know is still refused (``SchemaError``)."""
    try:
        _read_parquet(path)
    except SchemaError:
        raise
    except SplitlabError as e:
        return str(e)
    return None


def read_parquet_or_warn(path: Path) -> pd.DataFrame | None:
    """A sweep's ``results.parquet``, or None with a warning if it is damaged (the journals then stand alone:
    they are the source of truth). A newer schema version is still refused."""
    try:
        return _read_parquet(path)
    except SchemaError:
        raise
    except SplitlabError as e:
        warnings.warn(f"{e}; reading the sweep from its journals (rows only the Parquet held are lost)",
                      stacklevel=2)
        return None


def _journal_frame(sweep_dir: Path, st: SweepState, skip_bad: bool = False) -> pd.DataFrame:
    """The journals' rows as a frame; a row this schema does not allow is an error naming its journal and line
    (with ``skip_bad``: dropped, and listed in ``st.bad_lines``). Rows of a schema version this splitlab does not
    know are refused either way: a newer sweep is never appended to."""
    try:
        return frame(st.rows, where=sweep_dir)
    except SchemaError:
        newer = [r.get("schema_version") for r in st.rows if isinstance(r.get("schema_version"), int)
                 and r.get("schema_version") not in SUPPORTED_SCHEMAS]
        if newer:
            _check_versions(newer, sweep_dir)
        bad = []
        for i, (r, j, line) in enumerate(zip(st.rows, st.row_journals, st.row_lines, strict=True)):
            try:
                frame([r], where=f"{sweep_dir / j}: line {line}")
            except SchemaError as e:
                if not skip_bad:
                    raise SchemaError(f"{e}; {SKIP_BAD_LINES}") from None
                bad.append(i)
                st.bad_lines.append((j, line, str(e).split(f"line {line}: ", 1)[-1]))
        if not bad:
            raise
        for i in reversed(bad):
            del st.rows[i], st.row_journals[i], st.row_lines[i]
        return frame(st.rows, where=sweep_dir)


def rebuild(sweep_dir: Path, *, skip_bad: bool = False) -> tuple[pd.DataFrame, SweepState]:
    """A sweep folder's rows rebuilt from its journals (one per point, ``best_rows``' choice), plus the rows of
    its Parquet that no journal holds (so a folder whose journals were deleted keeps its data; a damaged Parquet
    is skipped with a warning); and the journals' state as read (``sizes`` for the Parquet's metadata, the
    sessions for the sidecar; with ``skip_bad``, the damaged journal lines skipped, ``bad_lines``)."""
    sweep_dir = Path(sweep_dir)
    st = sweep_state(sweep_dir, skip_bad=skip_bad)
    df = _journal_frame(sweep_dir, st, skip_bad)
    pq_path = sweep_dir / "results.parquet"
    old = read_parquet_or_warn(pq_path) if pq_path.is_file() else None
    if old is not None and len(old):
        have = pd.MultiIndex.from_frame(df[list(KEY)]) if len(df) else pd.MultiIndex.from_tuples([], names=KEY)
        extra = old[~pd.MultiIndex.from_frame(old[list(KEY)]).isin(have)]
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
        if not js:
            return _read_parquet(pq_path)
        try:
            built_from = parquet_meta(pq_path).get("journals")
            sizes = {j.name: j.stat().st_size for j in js}
        except SplitlabError:
            built_from, sizes = None, {}  # damaged: rebuild says so and reads the journals
        except OSError:
            built_from, sizes = None, {}  # a journal vanished while listed: read them again
        if built_from == sizes:
            try:
                return _read_parquet(pq_path)
            except SchemaError:
                raise
            except SplitlabError:
                pass  # damaged past its footer: rebuild says so and reads the journals
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


def _read_source(s: Path) -> pd.DataFrame:
    if s.is_dir():
        return sweep_frame(s)
    if s.suffix == ".parquet":
        return _read_parquet(s)
    if s.suffix == ".jsonl":
        return frame(journal_rows(s), where=s)
    raise SplitlabError(f"path={str(s)!r} is not allowed; expected a sweep folder, .parquet or .jsonl")


def load(*paths: str | Path) -> pd.DataFrame:
    """Read any number of sweeps (folders, folders of folders, Parquet files, journals, or the name of a set or a
    role in the catalog, ``splitlab.catalog``: ``load("h200")``, ``load("confirm")``) into one DataFrame.

    Refuses (``SchemaError``) data of a schema version this splitlab does not know, and (``SplitlabError``
    naming the file) anything it cannot read. Rows are unique per (sweep_id, device, point_id); where a sweep
    holds a point twice, ``best_rows`` chooses."""
    if not paths:
        raise SplitlabError("load() needs at least one path")
    frames = []
    for p in [src for x in paths for src in catalog.sources(x)]:
        try:
            srcs = _sources(p)
        except OSError as e:
            raise SplitlabError(f"path={str(p)[:200]!r} cannot be read ({e.strerror or _why(e)}); expected a sweep "
                                "folder, a folder of sweeps, a .parquet file or a journal") from None
        if not srcs:
            raise SplitlabError(f"{p}: no sweep results under it (no sweep.json, no .parquet)")
        for s in srcs:
            try:
                frames.append(_read_source(s))
            except SplitlabError:
                raise
            except Exception as e:  # a damage no check above foresaw: still one line naming the file
                raise SplitlabError(f"{s}: cannot be read as splitlab results ({_why(e)})") from None
    frames = [f for f in frames if len(f)]
    if not frames:
        return _typed(pd.DataFrame(columns=list(COLUMNS)), "empty")
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    out = best_rows(df, ("sweep_id", *KEY))
    out.attrs.pop("duplicates", None)
    return out


def one_per_point(df: pd.DataFrame) -> pd.DataFrame:
    """One row per measured point, keyed by (device, SM count, ``point_id``) as ``analysis.SHAPE`` keys shapes: a
    point measured by two sweeps of one device (a ``quick`` grid is a subset of ``default``) is kept from the sweep
    with more rows (the later one on a tie), so no shape or planner choice counts twice, while two devices' rows
    of one point both stay. The number dropped is in ``df.attrs["duplicates"]``."""
    if df.empty or "point_id" not in df.columns:
        return df
    key = [c for c in ("device", "sm_count", "point_id") if c in df.columns]
    size = df.groupby("sweep_id")["point_id"].transform("size")
    order = df.assign(_n=size, _t=df["finished_at"].fillna("")).sort_values(["_n", "_t"], ascending=False)
    out = order.drop_duplicates(key, keep="first").drop(columns=["_n", "_t"]).sort_index()
    out = out.reset_index(drop=True)
    out.attrs["duplicates"] = len(df) - len(out)
    return out


def load_points(*data: str | Path) -> pd.DataFrame:
    """The rows of ``data`` (catalog names or paths, read together by ``load``), one per point."""
    return one_per_point(load(*data))


def to_csv(df_or_paths: pd.DataFrame | str | Path, out: str | Path) -> Path:
    """Export results (a DataFrame, or a path ``load`` takes) as CSV."""
    df = df_or_paths if isinstance(df_or_paths, pd.DataFrame) else load(df_or_paths)
    out = Path(out)
    df.to_csv(out, index=False)
    return out


def workload(row: dict | pd.Series) -> DecodeWorkload:
    """The ``DecodeWorkload`` of a result row, e.g. to ask a planner after the fact: its lengths drawn as
    ``LENGTH_COLUMNS`` say (uniform where a row lacks them or holds ``<NA>``: data from before ragged batches)."""
    def value(c: str) -> object:
        return row[c].item() if hasattr(row[c], "item") else row[c]

    lengths = {c: value(c) for c in LENGTH_COLUMNS if c in row and not pd.isna(row[c])}
    return DecodeWorkload(**{c: value(c) for c in WORKLOAD_COLUMNS}, **lengths)
