"""One interface over every planner: ``plan(workload, device, planner) -> Plan`` and a registry.

Each port module registers an *adapter*: a function of ``(DecodeWorkload, DeviceSpec)`` that maps the
workload onto its rule's own arguments the way the upstream caller does (its docstring says how), calls
the faithful port, and returns a ``Plan``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from splitlab import families
from splitlab.devices import DeviceSpec
from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError
from splitlab.workloads import KINDS, DecodeWorkload


@dataclass(frozen=True)
class Plan:
    """What a planner picks for one decode call.

    ``num_splits`` is the split-K factor (for per-request planners, the largest over the batch, with the
    per-request values in ``per_request``). Tiles are set only where the rule picks one: ``block_n`` keys
    per tile of a dense kernel, ``block_k`` candidates per tile of a sparse kernel, ``block_h`` query
    heads per program; a kernel can be launched with them. ``kv_chunk`` is not a tile: the keys (tokens) one
    split covers, set by planners that choose a chunk length and derive the split count from it (FlashInfer's
    ``kv_chunk_size``: a request of ``n > 0`` keys gets ``cdiv(n, kv_chunk)`` splits). ``note`` says how the
    workload was mapped onto the rule.
    """

    planner: str
    num_splits: int
    block_n: int | None = None
    block_k: int | None = None
    block_h: int | None = None
    kv_chunk: int | None = None
    per_request: tuple[int, ...] | None = None
    note: str = ""
    extra: dict = field(default_factory=dict, compare=False)


Adapter = Callable[[DecodeWorkload, DeviceSpec], Plan]

#: Names a planner may not take: words the command lines give other meanings (``--planner all``, a result set's
#: ``best`` / ``oracle``).
RESERVED = ("all", "best", "oracle")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # no "," (the planners column lists names) and no "@" (name@device tags)


@dataclass(frozen=True)
class Entry:
    name: str
    adapter: Adapter
    kinds: tuple[str, ...]
    source: str
    module: str = ""  # where the adapter was defined: splitlab's own modules, or a plugin's

    @property
    def builtin(self) -> bool:
        return self.module == "splitlab" or self.module.startswith("splitlab.")


_REGISTRY: dict[str, Entry] = {}

#: The most splits splitlab's kernels launch, per family: the split grid dimension's CUDA limit
#: (``kernels.gqa.MAX_SPLITS``, ``kernels.mla.MAX_SPLITS``, which sparse MLA's launcher takes too; restated here, where
#: no torch is imported, and held equal by a test). A plugin's plan beyond it is refused. A view of
#: ``splitlab.families`` (each record's ``kernel_max_splits``), by kind.
KERNEL_MAX_SPLITS = {f.kind: f.kernel_max_splits for f in families.ALL}


def register(name: str, adapter: Adapter | None = None, *, kinds: Sequence[str], source: str = ""
             ) -> Callable[[Adapter], Adapter]:
    """Register ``adapter`` (a function ``(DecodeWorkload, DeviceSpec) -> Plan``) under ``name`` for the workload
    kinds it covers; as a decorator when ``adapter`` is left out. A user's module does this to add its planner
    (``splitlab --plugin MODULE``): it then takes part like the built-in ones (``splitlab plan``, the sweep's planner
    choices, ``analysis.replay``, ``splitlab regress``). ``source`` says where the rule comes from (default: the
    adapter's module).

    Refused, one ``SplitlabError`` each: a name that is empty, holds characters other than letters, digits and
    ``_ . -``, or is reserved (``RESERVED``); kinds outside ``workloads.KINDS`` or none; a name already registered
    by another function (registering the same function again, a module imported twice, is a no-op)."""

    def deco(fn: Adapter) -> Adapter:
        if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED:
            raise SplitlabError(f"planner name {name!r} is not allowed; expected letters, digits and _ . - (not "
                                f"{', '.join(RESERVED)})")
        ks = tuple(kinds) if not isinstance(kinds, str) else (kinds,)
        if not ks or any(k not in KINDS for k in ks):
            raise SplitlabError(f"planner {name!r}: kinds={list(ks)!r} is not allowed; expected some of "
                                f"{', '.join(KINDS)}")
        if not callable(fn):
            raise SplitlabError(f"planner {name!r}: {fn!r} is not allowed; expected a function (workload, device) "
                                "-> Plan")
        module = getattr(fn, "__module__", "") or ""
        old = _REGISTRY.get(name)
        if old is not None:
            same = (old.module, getattr(old.adapter, "__qualname__", None)) == (
                module, getattr(fn, "__qualname__", None))
            if same:
                return fn
            raise SplitlabError(f"planner {name!r} is registered twice: by {old.module or '?'} and by {module or '?'}; "
                                "expected one adapter per name (choose another name)")
        _REGISTRY[name] = Entry(name, fn, ks, source or module, module)
        return fn

    return deco if adapter is None else deco(adapter)


def names(kind: str | None = None) -> list[str]:
    """Registered planner names (those covering ``kind`` when given)."""
    return [n for n, e in _REGISTRY.items() if kind is None or kind in e.kinds]


def entry(name: str) -> Entry:
    if name not in _REGISTRY:
        raise SplitlabError(f"planner={name!r} is not allowed; expected one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def plan(workload: DecodeWorkload, device: DeviceSpec | str, planner: str = "splitlab") -> Plan:
    """Ask ``planner`` what it picks for ``workload`` on ``device`` (a ``DeviceSpec`` or preset name).

    A plugin's adapter (``Entry.builtin`` false) is held to the interface: anything but a ``SplitlabError`` it
    raises, and a result that is not a ``Plan`` with a split count of at least 1, becomes one ``SplitlabError``
    naming the planner (a refusal, as a built-in rule's out-of-domain ``SplitlabError`` is); so does a split count
    (or a request's, in ``per_request``) beyond the kernels' limit for the family (``KERNEL_MAX_SPLITS``)."""
    e = entry(planner)
    dev = get_device(device) if isinstance(device, str) else device
    if workload.kind not in e.kinds:
        raise SplitlabError(f"planner={planner!r} does not cover kind={workload.kind!r}; it covers "
                            f"{', '.join(e.kinds)}")
    if e.builtin:
        return e.adapter(workload, dev)
    try:
        p = e.adapter(workload, dev)
    except SplitlabError:
        raise
    except Exception as ex:
        raise SplitlabError(f"planner {planner!r} ({e.module}) raised {type(ex).__name__}: {ex}") from None
    ok = isinstance(p, Plan) and isinstance(p.num_splits, int) and not isinstance(p.num_splits, bool) \
        and p.num_splits >= 1
    if not ok:
        got = f"num_splits={p.num_splits!r}" if isinstance(p, Plan) else repr(p)
        raise SplitlabError(f"planner {planner!r} ({e.module}) returned {got}; expected a Plan with an integer "
                            "num_splits >= 1")
    limit = KERNEL_MAX_SPLITS[workload.kind]
    per_request = p.per_request if isinstance(p.per_request, tuple | list) else ()
    most = max([p.num_splits, *(n for n in per_request if isinstance(n, int) and not isinstance(n, bool))])
    if most > limit:
        where = "num_splits=" if most == p.num_splits else "a per_request split count of "
        raise SplitlabError(f"planner {planner!r} ({e.module}) returned {where}{most}; expected at most {limit} "
                            f"splits (the {workload.kind} kernels' limit)")
    return p
