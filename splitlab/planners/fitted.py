"""The constants of splitlab's wave-cost rule as data: one small TOML file per device, written by ``splitlab fit``.

The ``splitlab`` planner (``planners.splitlab``) reads its constants from such a file: those fitted for the device it
plans for (shipped ones in ``splitlab/planners/constants/<device>.toml``), a user's file where one is given
(``planners.splitlab.use_constants``, ``SPLITLAB_CONSTANTS``, ``splitlab plan --constants``). A file (format 1)::

    format = 1
    device = "h200-sxm"                 # the preset the data were measured on (what the constants are for)
    data = ["h200"]                     # what the fit read: catalog names or sweep folders
    kernel_versions = ["6"]             # catalog sets: their kernel version; folders: the splitlab that swept them
    timing = "measured"                 # or "modelled": fitted on the fake timer's figures (CI), not a GPU's

    [gqa]                               # a family (gqa, mla, sparse_mla): the fields of CostConstants
    ctas_per_sm = 1
    ...
    [gqa.range]                         # what the data covered (planners.fitted_range.ranges_from_rows)
    batch = [1, 256]
    ...
    [gqa.held_out]                      # the fitted rule on the held-out shapes (splitlab.scoring.held_out) of
    shapes = 82                         # uniform lengths (every request the longest)
    geomean = 1.0052
    worst = 1.0581
    [gqa.held_out_ragged]               # and on the ragged ones (length_dist not uniform), when the data hold any
    [gqa.confirm.h200-confirm]          # on each confirm set scored, when any was: its uniform shapes,
    [gqa.confirm_ragged.h200-confirm]   # and its ragged ones, when it holds any

Only the family tables' constants enter a plan; the rest is the record of where they come from. Nothing here
imports torch. Source: splitlab (this repository).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from splitlab import families
from splitlab.errors import SplitlabError
from splitlab.workloads import KINDS

#: The file format this module reads and writes.
FORMAT = 1
#: Where the shipped constants live (package data): ``<device preset>.toml``.
SHIPPED_DIR = Path(__file__).resolve().parent / "constants"
#: The families a file may hold.
FAMILIES = KINDS
#: The top-level keys of a file, and the keys of a family table that are records, not constants.
_TOP_KEYS = ("format", "device", "data", "kernel_versions", "timing", *FAMILIES)
_RECORD_KEYS = ("range", "held_out", "held_out_ragged", "confirm", "confirm_ragged")
_TIMINGS = ("measured", "modelled")


@dataclass(frozen=True)
class CostConstants:
    """The few constants of the fitted rule for one kernel family (``planners.splitlab``'s comment says what each
    prices)."""

    ctas_per_sm: int  # wide tiles (>= 64 query-head rows per program)
    ctas_per_sm_narrow: int  # narrow tiles (16 or 32 rows)
    fixed: float
    combine: float
    combine_per_split: float  # per split and SM, in units of one split's partial rows (P)
    max_splits: int
    small_key_tile: float = 0.0  # sparse MLA: a BLOCK_K 32 tile's cost in 64-key tiles; 0: never weighed
    partial: float = 0.0  # a split's partial-row write, in units of P
    tail: float = 1.0  # what a partly filled last wave costs: 1 a whole wave (ceil), 0 its filled fraction
    narrow_tile: float = 0.0  # sparse MLA: a 16-row head tile's cost per key tile, in tl tiles; 0: never weighed
    lone: float = -1.0  # a launch of less than one wave costs max(LONE, its fill) of a wave; < 0: off (``tail``)
    sm90_tile: float = 1.0  # the Gluon 64-row tile's cost per key tile, in the tl kernel's (``sm90_tile_runs``)
    ctas_per_sm_mid: int = 0  # GQA's 32- and 64-row tiles (4 warps; ``planners.splitlab.mid_tile``); 0: narrow width
    drain: float = -1.0  # ragged batches: a narrow CTA's time alone as the launch drains, in its time in a full
    #                     wave (``planners.splitlab.ragged_launch_time``'s CAP); < 0: LONE's (no floor: 1)
    tile32: float = 0.0  # MLA: the tl 32-row head tile's cost per key tile, in 16-row tiles; 0: the rule weighs
    #                      MLA's default head tile only (and it costs 1)
    persistent: float = 0.0  # schedules: a persistent slot's key tile (the work-list kernel's loop over a slot's
    #                          items: stream-K's) in the one-item kernel's, narrow and mid tiles; 0: not weighed
    persistent_wide: float = 0.0  # the same for wide tiles (>= 64 query-head rows a program)
    item_fixed: float = 0.0  # schedules: the work-list kernels' fixed cost per item, in key tiles; 0: FIXED's


_INT_FIELDS = ("ctas_per_sm", "ctas_per_sm_narrow", "ctas_per_sm_mid", "max_splits")
_REQUIRED = tuple(f.name for f in fields(CostConstants) if f.default is MISSING)
#: The split range per family: the kernel cards' ``num_splits`` range (``kernels/*.toml``; a test holds them equal),
#: what the sweeps time (``planners.splitlab.MAX_SPLITS`` is this dict). A file's ``max_splits`` stays within it.
#: A view of ``splitlab.families`` (each record's ``max_splits``), by kind.
MAX_SPLITS = {f.kind: f.max_splits for f in families.ALL}
#: The most CTAs one SM (CU) runs at once, on any GPU (NVIDIA: 32 resident blocks; AMD: 32 workgroups).
MAX_CTAS_PER_SM = 64
#: The largest cost constant a file may hold, in key tiles of one CTA (the fitted ones are below 50).
MAX_COST = 1e6
#: What each constant may be, by its meaning: (lowest, highest, lowest excluded, what it is). No cost is negative;
#: ``max_splits`` (None here) is bounded by the family's ``MAX_SPLITS``.
BOUNDS: dict[str, tuple[float, float | None, bool, str]] = {
    "ctas_per_sm": (1, MAX_CTAS_PER_SM, False, "CTAs an SM runs at once"),
    "ctas_per_sm_narrow": (1, MAX_CTAS_PER_SM, False, "CTAs an SM runs at once"),
    "ctas_per_sm_mid": (0, MAX_CTAS_PER_SM, False, "CTAs an SM runs at once (0: the narrow width)"),
    "max_splits": (1, None, False, "the family's split limit"),
    "fixed": (0, MAX_COST, False, "a cost (never negative)"),
    "combine": (0, MAX_COST, False, "a cost (never negative)"),
    "combine_per_split": (0, MAX_COST, False, "a cost (never negative)"),
    "partial": (0, MAX_COST, False, "a cost (never negative)"),
    "small_key_tile": (0, MAX_COST, False, "a cost (never negative; 0: never weighed)"),
    "narrow_tile": (0, MAX_COST, False, "a cost (never negative; 0: never weighed)"),
    "tile32": (0, MAX_COST, False, "a cost (never negative; 0: never weighed)"),
    "persistent": (0, MAX_COST, False, "a cost (never negative; 0: never weighed)"),
    "persistent_wide": (0, MAX_COST, False, "a cost (never negative; 0: never weighed)"),
    "item_fixed": (0, MAX_COST, False, "a cost (never negative; 0: the fixed cost's)"),
    "sm90_tile": (0, MAX_COST, True, "a cost (> 0)"),
    "tail": (0, 1, False, "a share of a wave"),
    "lone": (-MAX_COST, 1, False, "a share of a wave (< 0: off)"),
    "drain": (-MAX_COST, 1, False, "a share of a wave's time (< 0: LONE's)"),
}


@dataclass(frozen=True)
class FittedConstants:
    """One constants file: the constants per family and the record of how they were fitted."""

    device: str
    families: dict[str, CostConstants]
    data: tuple[str, ...] = ()
    kernel_versions: tuple[str, ...] = ()
    timing: str = "measured"
    ranges: dict[str, dict[str, Any]] = field(default_factory=dict)  # per family: what the data covered
    held_out: dict[str, dict[str, Any]] = field(default_factory=dict)  # per family: shapes, geomean, worst
    confirm: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # per family, per set
    # The same scores on ragged batches (``held_out`` and ``confirm`` are the uniform ones'): families with any.
    held_out_ragged: dict[str, dict[str, Any]] = field(default_factory=dict)
    confirm_ragged: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """Where the constants come from, in a few words: the shipped file's device, else the file's path."""
        if self.path is not None and self.path.parent == SHIPPED_DIR:
            return f"{self.device} (shipped)"
        return str(self.path) if self.path is not None else f"fitted for {self.device}"


# --- reading -------------------------------------------------------------------------------------------------

def _bad(path: Path, key: str, value: object, allowed: str) -> SplitlabError:
    return SplitlabError(f"{path}: {key}={value!r} is not allowed; expected {allowed}")


def _g(x: float) -> str:
    return f"{x:g}".replace("e+0", "e")  # 1e6, not 1e+06


def _number(path: Path, kind: str, name: str, v: object) -> int | float:
    """Constant ``name`` of family ``kind``, held to ``BOUNDS`` (its meaning's range)."""
    key = f"{kind}.{name}"
    lo, hi, open_lo, what = BOUNDS[name]
    if hi is None:
        hi = MAX_SPLITS[kind]
        what = f"the {kind} kernels' split limit (their cards' num_splits range, planners.splitlab.MAX_SPLITS)"
    if name in _INT_FIELDS:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _bad(path, key, v, f"an integer in [{lo}, {hi}]: {what}")
        return v
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not (
            lo < v if open_lo else lo <= v) or v > hi:
        rng = f"{'(' if open_lo else '['}{_g(lo)}, {_g(hi)}]"
        raise _bad(path, key, v, f"a finite number in {rng}: {what}")
    return float(v)


def _constants(path: Path, kind: str, table: dict) -> CostConstants:
    known = {f.name for f in fields(CostConstants)}
    values = {}
    for k, v in table.items():
        if k in _RECORD_KEYS:
            continue
        if k not in known:
            raise SplitlabError(f"{path}: key '{kind}.{k}' is not allowed; expected the constants "
                                f"{', '.join(sorted(known))} (and the tables {', '.join(_RECORD_KEYS)})")
        values[k] = _number(path, kind, k, v)
    missing = [k for k in _REQUIRED if k not in values]
    if missing:
        raise SplitlabError(f"{path}: [{kind}] lacks {', '.join(missing)}; expected every constant the rule "
                            "needs (splitlab fit --out writes them all)")
    return CostConstants(**values)


def _str_list(path: Path, key: str, v: object) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str | int) for x in v):
        raise _bad(path, key, v, "a list of strings")
    return tuple(str(x) for x in v)


def _table(path: Path, key: str, v: object) -> dict:
    if not isinstance(v, dict):
        raise _bad(path, key, v, "a table")
    return v


def parse(text: str, path: Path) -> FittedConstants:
    """The ``FittedConstants`` of a file's ``text`` (``path`` names it in errors); anything malformed is one
    ``SplitlabError`` naming the file and the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SplitlabError(f"{path}: not valid TOML ({e}); expected a constants file (splitlab fit --out)") from None
    unknown = [k for k in raw if k not in _TOP_KEYS]
    if unknown:
        raise SplitlabError(f"{path}: key {unknown[0]!r} is not allowed; expected {', '.join(_TOP_KEYS)}")
    if raw.get("format") != FORMAT:
        raise _bad(path, "format", raw.get("format"), f"{FORMAT} (the constants format this splitlab reads)")
    device = raw.get("device")
    if not isinstance(device, str) or not device:
        raise _bad(path, "device", device, "the preset name the constants were fitted for")
    timing = raw.get("timing", "measured")
    if timing not in _TIMINGS:
        raise _bad(path, "timing", timing, " or ".join(_TIMINGS))
    families, ranges = {}, {}
    scores: dict[str, dict] = {k: {} for k in ("held_out", "held_out_ragged", "confirm", "confirm_ragged")}
    for kind in FAMILIES:
        if kind not in raw:
            continue
        table = _table(path, kind, raw[kind])
        families[kind] = _constants(path, kind, table)
        if "range" in table:
            ranges[kind] = _table(path, f"{kind}.range", table["range"])
        for key in ("held_out", "held_out_ragged"):
            if key in table:
                scores[key][kind] = _table(path, f"{kind}.{key}", table[key])
        for key in ("confirm", "confirm_ragged"):
            if key in table:
                scores[key][kind] = {n: _table(path, f"{kind}.{key}.{n}", t)
                                     for n, t in _table(path, f"{kind}.{key}", table[key]).items()}
    if not families:
        raise SplitlabError(f"{path}: no family table; expected one or more of {', '.join(f'[{k}]' for k in FAMILIES)}")
    return FittedConstants(device=device, families=families, data=_str_list(path, "data", raw.get("data", [])),
                           kernel_versions=_str_list(path, "kernel_versions", raw.get("kernel_versions", [])),
                           timing=timing, ranges=ranges, **scores, path=path)


def load(path: str | Path, arg: str = "constants") -> FittedConstants:
    """Read a constants file; a missing, unreadable or malformed one is one ``SplitlabError`` naming ``arg`` or the
    file."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        if not p.is_file():
            raise SplitlabError(f"{arg}={str(path)!r} is not a file; expected a constants file (splitlab fit --out)")
    except OSError as e:
        raise SplitlabError(f"{arg}={str(path)!r} cannot be read ({e.strerror or type(e).__name__}); expected a "
                            "constants file (splitlab fit --out)") from None
    return _load(p.resolve(), st.st_mtime_ns, st.st_size)


@cache
def _load(path: Path, mtime_ns: int, size: int) -> FittedConstants:
    if size > 1 << 20:
        raise SplitlabError(f"{path}: {size} bytes is not a constants file (they are a few KB)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SplitlabError(f"{path}: cannot be read as UTF-8 text ({e}); expected a constants file") from None
    return parse(text, path)


def shipped() -> dict[str, FittedConstants]:
    """The shipped constants files, by the device each was fitted for."""
    out = {}
    for p in sorted(SHIPPED_DIR.glob("*.toml")):
        fc = load(p)
        if fc.device != p.stem:
            raise SplitlabError(f"{p}: device={fc.device!r} is not allowed; expected {p.stem!r} (a shipped file is "
                                "named after its device)")
        out[fc.device] = fc
    return out


# --- writing -------------------------------------------------------------------------------------------------

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise SplitlabError(f"{v!r} cannot be written to a constants file; expected a finite number")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise SplitlabError(f"{v!r} cannot be written to a constants file; expected numbers, strings and lists")


def _lines(table: dict) -> list[str]:
    return [f"{_key(k)} = {_value(v)}" for k, v in table.items()]


def dumps(fc: FittedConstants) -> str:
    """The TOML text of ``fc`` (what ``parse`` reads back to an equal ``FittedConstants``)."""
    out = ["# splitlab's wave-cost rule (splitlab.planners.splitlab): its constants per kernel family, fitted by",
           "# `splitlab fit` on the data named below; the `splitlab` planner takes them when it plans for `device`",
           "# (splitlab/planners/fitted.py reads this file and says what each table holds).",
           f"format = {FORMAT}", f"device = {_value(fc.device)}", f"data = {_value(list(fc.data))}",
           f"kernel_versions = {_value(list(fc.kernel_versions))}", f"timing = {_value(fc.timing)}"]
    for kind in FAMILIES:
        c = fc.families.get(kind)
        if c is None:
            continue
        values = {f.name: getattr(c, f.name) for f in fields(CostConstants)}
        out += ["", f"[{kind}]", *_lines({k: (int(v) if k in _INT_FIELDS else float(v)) for k, v in values.items()})]
        if kind in fc.ranges:
            out += ["", f"[{kind}.range]", *_lines(fc.ranges[kind])]
        for key, held in (("held_out", fc.held_out), ("held_out_ragged", fc.held_out_ragged)):
            if kind in held:
                out += ["", f"[{kind}.{key}]", *_lines(held[kind])]
        uniform, ragged = fc.confirm.get(kind, {}), fc.confirm_ragged.get(kind, {})
        for name in dict.fromkeys([*uniform, *ragged]):  # a set's two tables side by side
            for key, conf in (("confirm", uniform), ("confirm_ragged", ragged)):
                if name in conf:
                    out += ["", f"[{kind}.{key}.{_key(name)}]", *_lines(conf[name])]
    return "\n".join(out) + "\n"
