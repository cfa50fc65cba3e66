"""Kernel cards: one TOML file per kernel under study (``kernels/*.toml``), loaded and validated.

A card says what to run and over what::

    card = 1                                   # card format version
    name = "gqa_decode"                        # the ``kernel`` column
    kind = "gqa"                               # gqa | mla | sparse_mla
    seed = ["000"]                             # the seed system(s) it comes from
    device = "h200"                            # preset to plan for when no GPU is present

    [impl]
    type = "kernel"                            # kernel: a splitlab-style launcher; external: an ``Impl`` object
    label = "splitlab-triton"                  # the ``impl`` column
    import = "splitlab.kernels.gqa:gqa_decode"
    reference = "splitlab.kernels.reference:gqa_decode"      # kernel only
    launch_facts = "splitlab.kernels.gqa:gqa_launch_facts"   # kernel only
    timer = "graph"                            # default timer (graph | events)

    [knobs]                                    # each knob the grids may set, and its range
    num_splits = { min = 1, max = 64 }         # or values = [...]; pow2 = true keeps powers of two only
    block_n = { values = [16, 32, 64, 128] }
    scheduler = { values = ["uniform", "balanced"] }   # work-list kernels only: planners.schedulers.NAMES
    sched_ctas = { min = 1, max = 4096 }       # balanced / stream_k: the CTAs they deal over (default: the SMs')

    [planners]
    compare = "all"                            # the planners the analysis compares (a list, or "all")
    knobs = ["num_splits"]                     # which plan fields a planner's choice sets

    [[grids.quick]]                            # a grid is a list of blocks; each block is a product
    model = ["llama-3-8b"]                     # workload presets, or num_q_heads/num_kv_heads/head_dim_*
    batch = [1, 16]
    ctx_len = [8192, 65536]
    lengths = ["uniform", "spread16"]          # optional: each batch's length distributions (default uniform,
    length_seed = [0, 1]                       # workloads.LENGTH_DISTS) and their seeds (default 0)
    num_splits = "pow2"                        # a knob axis: a list, one value, or "pow2" (its range's powers);
                                               # num_splits also "pow2+waves": and each shape's wave-filling
                                               # split counts (waves.wave_fill_splits)
    scheduler = ["uniform", "balanced"]        # schedules (a string or a list): num_splits goes to uniform only,
                                               # sched_ctas to balanced and stream_k only
    max_kv_gb = 16                             # optional: skip shapes with more unique KV
    min_keys_per_split = 32                    # optional (default 32): skip splits of fewer keys
    planner_devices = ["mi355x"]               # optional: also measure planners' choices for these presets

Every card has the grids ``quick`` and ``default``; most also ``seed``. Anything malformed raises
``CardError`` naming the file, the key and what is allowed; so does a card too large to sweep, counted from its
lists before any shape is built (``MAX_BLOCK_SHAPES`` a block, ``MAX_GRID_POINTS`` a grid, ``MAX_CARD_SHAPES`` a
card).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitlab import devices, families, workloads
from splitlab.bench.impls import KNOB_COLUMNS, Impl, KernelImpl, resolve, scheduler_names
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

CARD_VERSION = 1
REQUIRED_GRIDS = ("quick", "default")
IMPL_TYPES = ("kernel", "external")
CARD_TIMERS = ("graph", "events")
IMPL_PROTOCOL = ("knobs", "unavailable", "launch_facts", "inputs", "reference", "call")

_TOP_KEYS = ("card", "name", "kind", "seed", "description", "device", "impl", "knobs", "planners", "grids")
_IMPL_KEYS = ("type", "label", "import", "reference", "launch_facts", "timer", "description")
_KNOB_KEYS = ("values", "min", "max", "pow2")
_PLANNER_KEYS = ("compare", "knobs")
_SHAPE_INT_KEYS = ("batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len", "page_size",
                   "topk")
_LENGTH_KEYS = ("lengths", "length_seed")  # a batch's length distributions and seeds (DecodeWorkload.length_dist)
_BLOCK_OPTIONS = ("max_kv_gb", "min_keys_per_split", "planner_devices", "description")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DEFAULT_MIN_KEYS_PER_SPLIT = 32
#: The largest value a knob range may allow (``knobs.NAME.max`` and each of ``values``).
MAX_KNOB = 1 << 16
#: The most shapes one block may make (the product of its shape lists and models).
MAX_BLOCK_SHAPES = 100_000
#: The most points one grid may make, counted from its lists before anything is built (each block's shapes times
#: its knob settings and its planners' choices): a million points is about five days of one GPU at 0.4 s a point.
MAX_GRID_POINTS = 1_000_000
#: The most shapes all of a card's grids may make together (each is built and checked when the card is read).
MAX_CARD_SHAPES = 200_000
#: A card larger than this is not a card (the shipped ones are a few KB).
MAX_CARD_BYTES = 1 << 20
#: Knobs whose values are names, not integers: ``scheduler`` (``impls.scheduler_names`` of the card's kind).
STRING_KNOBS = ("scheduler",)


class CardError(SplitlabError):
    """A malformed kernel card: the message names the file, the key and what is allowed."""


@dataclass(frozen=True)
class KnobRange:
    """What a card allows for one knob: an explicit ``values`` set, or integers in ``[lo, hi]``; ``pow2``
    keeps powers of two only. A string knob (``STRING_KNOBS``: ``scheduler``) has a ``values`` set of names."""

    name: str
    values: tuple[int | str, ...] | None = None
    lo: int = 1
    hi: int = 1 << 16
    pow2: bool = False

    @property
    def strings(self) -> bool:
        return self.name in STRING_KNOBS

    def allows(self, v: object) -> bool:
        if self.strings:
            return isinstance(v, str) and v in (self.values or ())
        if isinstance(v, bool) or not isinstance(v, int):
            return False
        if self.pow2 and (v < 1 or v & (v - 1)):
            return False
        return v in self.values if self.values is not None else self.lo <= v <= self.hi

    def describe(self) -> str:
        if self.values is not None:
            return "one of " + ", ".join(map(str, self.values))
        return f"{'a power of two' if self.pow2 else 'an integer'} in [{self.lo}, {self.hi}]"

    def powers_of_two(self) -> tuple[int, ...]:
        """Every power of two the range allows, ascending."""
        if self.values is not None:
            return tuple(sorted(v for v in self.values if v >= 1 and not v & (v - 1)))
        out, v = [], 1
        while v <= self.hi:
            if v >= self.lo:
                out.append(v)
            v *= 2
        return tuple(out)


@dataclass(frozen=True)
class Block:
    """One block of a grid: its shapes (validated workloads, in product order) and knob axes."""

    where: str  # "grids.default[2]", for messages
    shapes: tuple[DecodeWorkload, ...]
    knob_axes: dict[str, tuple[int | str, ...]]
    max_kv_gb: float | None = None
    min_keys_per_split: int = DEFAULT_MIN_KEYS_PER_SPLIT
    planner_devices: tuple[str, ...] = ()
    description: str = ""
    wave_splits: int = 0  # num_splits = "pow2+waves": also each shape's wave-filling splits up to this many


@dataclass(frozen=True)
class Card:
    """A validated kernel card. ``impl`` is the implementation object the runner drives."""

    path: Path
    name: str
    kind: str
    seeds: tuple[str, ...]
    description: str
    device: str
    impl_type: str
    impl_label: str
    impl_import: str
    impl: Impl = field(repr=False, compare=False)
    timer: str
    knobs: dict[str, KnobRange]
    compare: tuple[str, ...]
    planner_knobs: tuple[str, ...]
    grids: dict[str, tuple[Block, ...]] = field(repr=False)
    text: str = field(repr=False, default="")

    @property
    def sha1(self) -> str:
        """sha1 of the card's text (recorded with every sweep)."""
        return hashlib.sha1(self.text.encode()).hexdigest()

    def grid(self, name: str) -> tuple[Block, ...]:
        """The blocks of grid ``name``; ``CardError`` naming the grids there are otherwise."""
        if name not in self.grids:
            raise _no_grid(self.path, name, self.grids)
        return self.grids[name]


def _no_grid(path: Path, name: str, grids: Iterable[str]) -> CardError:
    return CardError(f"{path}: grids.{name} does not exist; expected one of {', '.join(grids)}")


def check_grid(path: Path, name: str) -> None:
    """Refuse a grid name the card file at ``path`` does not declare (``Card.grid``'s ``CardError``), reading its
    TOML only: without importing its kernel (torch, Triton), so that ``splitlab sweep`` refuses a bad ``--grid`` in
    a fraction of a second. A file that is no readable TOML card with a ``[grids]`` table passes: ``load`` says
    what is wrong with it."""
    try:
        if path.stat().st_size > MAX_CARD_BYTES:
            return
        grids = tomllib.loads(path.read_text(encoding="utf-8")).get("grids")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return
    if isinstance(grids, dict) and name not in grids:
        raise _no_grid(path, name, grids)


# --- locating cards ---------------------------------------------------------------------------------------

def cards_dir() -> Path:
    """The shipped cards' folder: the repository's ``kernels/``, or its copy in an installed package."""
    from splitlab.resources import cards_dir as shipped

    return shipped()


def names() -> list[str]:
    """Names of the shipped cards."""
    return sorted(p.stem for p in cards_dir().glob("*.toml"))


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL character
        return False


def find(card: str | Path) -> Path:
    """A card by path, or by name in ``./kernels`` or the repository's ``kernels/``."""
    from splitlab.args import shown

    p = Path(card)
    if str(card).strip() and _is_file(p):
        return p
    for base in (Path("kernels"), cards_dir()):
        q = base / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
        if p.name and _is_file(q):
            return q
    raise CardError(f"card={shown(str(card))} is not allowed; expected a card file or one of {', '.join(names())}")


# --- validation -------------------------------------------------------------------------------------------

class _Check:
    """Validation helpers that name the file and key in every message."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def bad(self, key: str, value: object, allowed: str) -> CardError:
        return CardError(f"{self.path}: {key}={value!r} is not allowed; expected {allowed}")

    def missing(self, key: str, allowed: str) -> CardError:
        return CardError(f"{self.path}: {key} is missing; expected {allowed}")

    def keys(self, where: str, table: dict, allowed: tuple[str, ...] | list[str]) -> None:
        for k in table:
            if k not in allowed:
                key = f"{where}.{k}" if where else k
                raise CardError(f"{self.path}: key {key!r} is not allowed; expected one of {', '.join(allowed)}")

    def table(self, key: str, value: object) -> dict:
        if not isinstance(value, dict):
            raise self.bad(key, value, "a table")
        return value

    def string(self, key: str, value: object, *, pattern: re.Pattern | None = None) -> str:
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
            raise self.bad(key, value, "a non-empty string" + (" of letters, digits, _ . -" if pattern else ""))
        return value

    def integer(self, key: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
                (maximum is not None and value > maximum):
            raise self.bad(key, value, f"an integer >= {minimum}" if maximum is None else
                           f"an integer in [{minimum}, {maximum}]")
        return value

    def int_list(self, key: str, value: object, minimum: int = 1, maximum: int | None = None) -> tuple[int, ...]:
        vals = value if isinstance(value, list) else [value]
        if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum or
                           (maximum is not None and v > maximum) for v in vals):
            rng = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
            raise self.bad(key, value, f"{rng} or a non-empty list of them")
        return tuple(vals)

    def str_list(self, key: str, value: object, choices: list[str] | None = None) -> tuple[str, ...]:
        vals = value if isinstance(value, list) else [value]
        allowed = ("one of " + ", ".join(choices)) if choices is not None else "strings"
        if not vals or any(not isinstance(v, str) or (choices is not None and v not in choices) for v in vals):
            raise self.bad(key, value, f"a string or a non-empty list of strings ({allowed})")
        return tuple(vals)


def _knob_range(c: _Check, name: str, spec: object, kind: str = "") -> KnobRange:
    key = f"knobs.{name}"
    spec = c.table(key, spec)
    c.keys(key, spec, _KNOB_KEYS)
    if name in STRING_KNOBS:  # scheduler: a set of names
        names = list(scheduler_names(kind))
        c.keys(key, spec, ("values",))
        if "values" not in spec:
            raise c.missing(f"{key}.values", f"a list of schedulers ({', '.join(names)})")
        vals = spec["values"] if isinstance(spec["values"], list) else [spec["values"]]
        if not vals or any(not isinstance(v, str) or v not in names for v in vals):
            raise c.bad(f"{key}.values", spec["values"], f"a non-empty list of the schedulers of kind {kind}: "
                        + ", ".join(names))
        return KnobRange(name, values=tuple(vals))
    pow2 = spec.get("pow2", False)
    if not isinstance(pow2, bool):
        raise c.bad(f"{key}.pow2", pow2, "true or false")
    if "values" in spec:
        if "min" in spec or "max" in spec:
            raise CardError(f"{c.path}: {key} has values and min/max; expected one or the other")
        return KnobRange(name, values=c.int_list(f"{key}.values", spec["values"], maximum=MAX_KNOB), pow2=pow2)
    if "min" not in spec or "max" not in spec:
        which = f"{key}.min and {key}.max" if "min" not in spec and "max" not in spec else \
            f"{key}.{'min' if 'min' not in spec else 'max'}"
        raise c.missing(which, "a range {min = .., max = ..} or values = [..]")
    lo, hi = c.integer(f"{key}.min", spec["min"], maximum=MAX_KNOB), c.integer(f"{key}.max", spec["max"],
                                                                                maximum=MAX_KNOB)
    if lo > hi:
        raise c.bad(f"{key}.max", hi, f"an integer >= min ({lo})")
    return KnobRange(name, lo=lo, hi=hi, pow2=pow2)


def _impl(c: _Check, kind: str, spec: dict, name: str) -> tuple[str, str, str, Impl, str | None]:
    c.keys("impl", spec, _IMPL_KEYS)
    kind_ = spec.get("type", "kernel")
    if kind_ not in IMPL_TYPES:
        raise c.bad("impl.type", kind_, "one of " + ", ".join(IMPL_TYPES))
    label = c.string("impl.label", spec.get("label", name), pattern=_NAME)
    timer = spec.get("timer")
    if timer is not None and timer not in CARD_TIMERS:
        raise c.bad("impl.timer", timer, "one of " + ", ".join(CARD_TIMERS))
    if "import" not in spec:
        raise c.missing("impl.import", "an import path 'package.module:attribute'")

    def load(key: str) -> Any:
        try:
            return resolve(spec[key])
        except SplitlabError as e:
            raise CardError(f"{c.path}: impl.{key}: {e}") from None

    if kind_ == "kernel":
        for key in ("reference", "launch_facts"):
            if key not in spec:
                raise c.missing(f"impl.{key}", "an import path 'package.module:attribute' (required for type "
                                "'kernel')")
        fns = {k: load(k) for k in ("import", "reference", "launch_facts")}
        for k, fn in fns.items():
            if not callable(fn):
                raise c.bad(f"impl.{k}", spec[k], "a callable")
        impl: Impl = KernelImpl(fns["import"], fns["reference"], fns["launch_facts"])
    else:
        for k in ("reference", "launch_facts"):
            if k in spec:
                raise CardError(f"{c.path}: key 'impl.{k}' is not allowed for type 'external'; the object at "
                                "impl.import brings its own")
        impl = load("import")
        lacking = [a for a in IMPL_PROTOCOL if not hasattr(impl, a)]
        if lacking:
            raise c.bad("impl.import", spec["import"], "an object with " + ", ".join(IMPL_PROTOCOL) +
                        f" (splitlab.bench.impls.Impl); it lacks {', '.join(lacking)}")
        kinds = getattr(impl, "kinds", None)
        if kinds is not None and kind not in kinds:
            raise c.bad("kind", kind, f"one of {', '.join(kinds)} (what {spec['import']} runs)")
    return kind_, label, spec["import"], impl, timer


@dataclass
class _Budget:
    """What a card's grids may still make (``MAX_GRID_POINTS``, ``MAX_CARD_SHAPES``), spent block by block before
    each block's shapes are built; ``choices``: the planners' choices per shape and device planned for."""

    choices: int
    grid: str = ""
    grid_points: int = 0
    card_shapes: int = 0

    def spend(self, c: _Check, where: str, shapes: int, settings: int, devices: int) -> None:
        points = shapes * (settings + self.choices * devices)
        self.grid_points += points
        self.card_shapes += shapes
        if self.grid_points > MAX_GRID_POINTS:
            chosen = f" + {self.choices * devices} planner choices" if self.choices else ""
            raise CardError(f"{c.path}: grids.{self.grid} makes up to {self.grid_points} points (at {where}: "
                            f"{shapes} shapes x ({settings} knob settings{chosen})); expected at most "
                            f"{MAX_GRID_POINTS} a grid (shorter lists, or several grids)")
        if self.card_shapes > MAX_CARD_SHAPES:
            raise CardError(f"{c.path}: the grids make up to {self.card_shapes} shapes (at {where}); expected at "
                            f"most {MAX_CARD_SHAPES} a card (shorter lists, or several cards)")


def _block(c: _Check, where: str, spec: object, kind: str, knobs: dict[str, KnobRange],
           budget: _Budget | None = None) -> Block | None:
    """One block, checked and built; with ``budget``, checked and counted only (``_Budget.spend``), not built
    (None): ``load`` counts every grid before it builds any."""
    spec = c.table(where, spec)
    allowed = ["model", *_SHAPE_INT_KEYS, "dtype", *_LENGTH_KEYS, *knobs, *_BLOCK_OPTIONS]
    if kind != "sparse_mla":
        allowed.remove("topk")
    c.keys(where, spec, allowed)

    # Knob axes.
    knob_axes: dict[str, tuple[int | str, ...]] = {}
    wave_splits = 0
    for k, rng in knobs.items():
        if k not in spec:
            continue
        v = spec[k]
        if rng.strings:
            knob_axes[k] = c.str_list(f"{where}.{k}", v, [str(x) for x in rng.values or ()])
            continue
        if v == "pow2":
            knob_axes[k] = rng.powers_of_two()
            continue
        if v == "pow2+waves" and k == "num_splits":
            if rng.values is not None or rng.pow2:
                raise c.bad(f"{where}.{k}", v, f"\"pow2\" or a list: knobs.{k} is {rng.describe()}, and "
                            "\"pow2+waves\" needs an integer range (knobs.num_splits = { min = 1, max = N })")
            knob_axes[k] = rng.powers_of_two()
            wave_splits = rng.hi
            continue
        if isinstance(v, str):
            raise c.bad(f"{where}.{k}", v, f"{rng.describe()}, a list of them, or \"pow2\""
                        + (" or \"pow2+waves\"" if k == "num_splits" else ""))
        vals = v if isinstance(v, list) else [v]
        bad_vals = [x for x in vals if not rng.allows(x)]
        if not vals or bad_vals:
            raise c.bad(f"{where}.{k}", v, f"values allowed by knobs.{k}: {rng.describe()} (or \"pow2\")")
        knob_axes[k] = tuple(vals)

    # Options.
    max_kv_gb = spec.get("max_kv_gb")
    if max_kv_gb is not None and (isinstance(max_kv_gb, bool) or not isinstance(max_kv_gb, int | float)
                                  or not math.isfinite(max_kv_gb) or max_kv_gb <= 0):
        raise c.bad(f"{where}.max_kv_gb", max_kv_gb, "a finite number > 0 (GB of unique KV)")
    mkps = c.integer(f"{where}.min_keys_per_split", spec.get("min_keys_per_split", DEFAULT_MIN_KEYS_PER_SPLIT))
    pdevs = c.str_list(f"{where}.planner_devices", spec["planner_devices"], devices.names()) \
        if "planner_devices" in spec else ()
    descr = c.string(f"{where}.description", spec["description"]) if "description" in spec else ""

    # Shapes.
    axes: dict[str, tuple] = {k: c.int_list(f"{where}.{k}", spec[k], minimum=1, maximum=workloads.LIMITS[k])
                              for k in _SHAPE_INT_KEYS if k in spec}
    axes["dtype"] = c.str_list(f"{where}.dtype", spec.get("dtype", "bf16"), list(workloads.DTYPES))
    if "lengths" in spec:
        axes["length_dist"] = c.str_list(f"{where}.lengths", spec["lengths"], list(workloads.LENGTH_DISTS))
    if "length_seed" in spec:
        axes["length_seed"] = c.int_list(f"{where}.length_seed", spec["length_seed"], minimum=0,
                                         maximum=workloads.MAX_LENGTH_SEED)
    models = c.str_list(f"{where}.model", spec["model"], workloads.names()) if "model" in spec else (None,)
    for m in models:
        if m is not None and workloads.get(m).kind != kind:
            raise c.bad(f"{where}.model", m, f"a {kind} workload preset (card kind={kind!r})")
    for k in ("batch", "ctx_len"):
        if k not in axes:
            raise c.missing(f"{where}.{k}", "an integer >= 1 or a list of them")
    if models == (None,):
        need = ["num_q_heads", "head_dim_qk"] + (["num_kv_heads"] if kind == "gqa" else ["head_dim_v"]) \
            + (["topk"] if kind == "sparse_mla" else [])
        for k in need:
            if k not in axes:
                raise c.missing(f"{where}.{k}", "an integer or a list (or model = a workload preset)")
    elif kind == "sparse_mla" and "topk" not in axes:
        axes["topk"] = (None,)
    shapes = []
    least: int | None = None  # the smallest unique KV of a shape max_kv_gb filtered out
    order = ("num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "page_size", "topk", "dtype", "batch",
             "ctx_len", "length_dist", "length_seed")
    present = [k for k in order if k in axes]
    n_shapes = len(models) * math.prod(len(axes[k]) for k in present)
    if n_shapes > MAX_BLOCK_SHAPES:
        raise CardError(f"{c.path}: {where} has {n_shapes} shapes (the product of its lists); expected at most "
                        f"{MAX_BLOCK_SHAPES}")
    if budget is not None:  # counted before any shape is built: a card of 10^7 points is refused at once
        from splitlab.waves import WAVE_FILL_WAVES  # the wave-filling split counts "pow2+waves" adds, at most

        settings = math.prod(len(v) + (WAVE_FILL_WAVES if k == "num_splits" and wave_splits else 0)
                             for k, v in knob_axes.items())
        budget.spend(c, where, n_shapes, settings, 1 + len(pdevs))
        return None
    for m in models:
        for combo in itertools.product(*(axes[k] for k in present)):
            f = dict(zip(present, combo, strict=True))
            lf = {k: f.pop(k) for k in ("length_dist", "length_seed") if k in f}
            if lf.get("length_dist", workloads.UNIFORM) == workloads.UNIFORM and \
                    lf.get("length_seed", 0) != axes.get("length_seed", (0,))[0]:
                continue  # uniform lengths have no seed: one shape, not one per seed
            try:
                if m is not None:
                    w = workloads.get(m, batch=f.pop("batch"), ctx_len=f.pop("ctx_len"), dtype=f.pop("dtype"),
                                      page_size=f.pop("page_size", None), topk=f.pop("topk", None))
                    if f:
                        if "head_dim_qk" in f and "head_dim_v" not in f and kind == "gqa":
                            f["head_dim_v"] = f["head_dim_qk"]
                        w = w.with_(**f)
                else:
                    f.setdefault("num_kv_heads", 1)
                    f.setdefault("head_dim_v", f["head_dim_qk"])
                    f.setdefault("page_size", families.by_kind(kind).page_size)
                    w = DecodeWorkload(kind=kind, **f)
                if lf:
                    w = w.with_(**lf)
            except SplitlabError as e:
                raise CardError(f"{c.path}: {where}: {e}") from None
            if max_kv_gb is None or w.kv_bytes <= max_kv_gb * 1e9:
                shapes.append(w)
            else:
                least = w.kv_bytes if least is None else min(least, w.kv_bytes)
    if not shapes:
        raise c.bad(f"{where}.max_kv_gb", max_kv_gb, f"a bound that keeps some shape of the block (every shape "
                    f"reads more unique KV; the smallest {least / 1e9:.3g} GB)")
    return Block(where, tuple(shapes), knob_axes, None if max_kv_gb is None else float(max_kv_gb), mkps, pdevs,
                 descr, wave_splits)


def load(path: str | Path) -> Card:
    """Read and validate a kernel card (a path, or a shipped card's name); ``CardError`` when malformed."""
    p = find(path)
    try:
        if p.stat().st_size > MAX_CARD_BYTES:
            raise CardError(f"{p}: {p.stat().st_size} bytes is not allowed; expected a card of at most "
                            f"{MAX_CARD_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CardError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason}); expected a TOML card in UTF-8") from None
    except OSError as e:
        raise CardError(f"{p}: cannot be read ({e.strerror or type(e).__name__}); expected a readable card") from None
    c = _Check(p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CardError(f"{p}: not valid TOML: {e}") from None
    c.keys("", data, _TOP_KEYS)
    version = data.get("card", CARD_VERSION)
    if version != CARD_VERSION:
        raise c.bad("card", version, f"{CARD_VERSION} (the card format this splitlab reads)")
    for k in ("name", "kind", "impl", "grids"):
        if k not in data:
            raise c.missing(k, {"name": "a string", "kind": "one of " + ", ".join(workloads.KINDS),
                                "impl": "a table [impl]", "grids": "tables [[grids.quick]], [[grids.default]]"}[k])
    name = c.string("name", data["name"], pattern=_NAME)
    kind = data["kind"]
    if kind not in workloads.KINDS:
        raise c.bad("kind", kind, "one of " + ", ".join(workloads.KINDS))
    seeds = c.str_list("seed", data["seed"]) if "seed" in data else ()
    descr = c.string("description", data["description"]) if "description" in data else ""
    device = data.get("device", "h200")
    if not isinstance(device, str):
        raise c.bad("device", device, "a preset name: " + ", ".join(devices.names()))
    try:
        device = devices.get(device).name
    except SplitlabError:
        raise c.bad("device", device, "a preset name: " + ", ".join(devices.names())) from None

    impl_type, label, import_path, impl, timer = _impl(c, kind, c.table("impl", data["impl"]), name)

    knobs_spec = c.table("knobs", data.get("knobs", {}))
    knobs: dict[str, KnobRange] = {}
    for k, spec in knobs_spec.items():
        if k not in impl.knobs:
            takes = ", ".join(impl.knobs) or "none"
            raise CardError(f"{p}: key 'knobs.{k}' is not allowed; expected one of the knobs {import_path} takes "
                            f"({takes}; known knobs: {', '.join(KNOB_COLUMNS)})")
        knobs[k] = _knob_range(c, k, spec, kind)

    pl = c.table("planners", data.get("planners", {}))
    c.keys("planners", pl, _PLANNER_KEYS)
    from splitlab import planners  # registry (pure Python)

    covering = planners.names(kind)
    compare_spec = pl.get("compare", "all")
    compare = tuple(covering) if compare_spec == "all" else c.str_list("planners.compare", compare_spec, covering)
    pknobs_default = ["num_splits"] if "num_splits" in knobs else []
    planner_knobs = c.str_list("planners.knobs", pl["knobs"], list(knobs)) if pl.get("knobs") else \
        tuple(pknobs_default)
    if planner_knobs and "num_splits" not in planner_knobs:
        raise c.bad("planners.knobs", list(planner_knobs), "a list that includes num_splits (or none at all)")

    grids_spec = c.table("grids", data["grids"])
    for g in REQUIRED_GRIDS:
        if g not in grids_spec:
            raise c.missing(f"grids.{g}", f"a grid (every card has {', '.join(REQUIRED_GRIDS)})")
    specs: dict[str, list] = {}
    budget = _Budget(len(covering) if planner_knobs else 0)
    for g, blocks in grids_spec.items():
        if not _NAME.match(g):
            raise c.bad(f"grids.{g}", g, "a grid name of letters, digits, _ . -")
        if isinstance(blocks, dict):
            blocks = [blocks]
        if not isinstance(blocks, list) or not blocks:
            raise c.bad(f"grids.{g}", blocks, "one or more blocks ([[grids.NAME]] tables)")
        budget.grid, budget.grid_points = g, 0
        for i, b in enumerate(blocks):  # every grid counted before any is built: an oversized card fails at once
            _block(c, f"grids.{g}[{i}]", b, kind, knobs, budget)
        specs[g] = blocks
    grids: dict[str, tuple[Block, ...]] = {
        g: tuple(_block(c, f"grids.{g}[{i}]", b, kind, knobs) for i, b in enumerate(blocks))  # type: ignore[misc]
        for g, blocks in specs.items()}

    return Card(path=p, name=name, kind=kind, seeds=seeds, description=descr, device=device, impl_type=impl_type,
                impl_label=label, impl_import=import_path, impl=impl, timer=timer or "graph", knobs=knobs,
                compare=compare, planner_knobs=planner_knobs, grids=grids, text=text)
