"""One interface over every planner: ``plan(workload, device, planner) -> Plan`` and a registry.

Each port module registers an *adapter*: a function of ``(DecodeWorkload, DeviceSpec)`` that maps the
workload onto its rule's own arguments the way the upstream caller does (its docstring says how), calls
the faithful port, and returns a ``Plan``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from splitlab.devices import DeviceSpec
from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload


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


@dataclass(frozen=True)
class Entry:
    name: str
    adapter: Adapter
    kinds: tuple[str, ...]
    source: str


_REGISTRY: dict[str, Entry] = {}


def register(name: str, *, kinds: tuple[str, ...], source: str) -> Callable[[Adapter], Adapter]:
    """Decorator: register ``adapter`` under ``name`` for the workload kinds it covers."""

    def deco(fn: Adapter) -> Adapter:
        if name in _REGISTRY:
            raise RuntimeError(f"planner {name!r} registered twice")
        _REGISTRY[name] = Entry(name, fn, kinds, source)
        return fn

    return deco


def names(kind: str | None = None) -> list[str]:
    """Registered planner names (those covering ``kind`` when given)."""
    return [n for n, e in _REGISTRY.items() if kind is None or kind in e.kinds]


def entry(name: str) -> Entry:
    if name not in _REGISTRY:
        raise SplitlabError(f"planner={name!r} is not allowed; expected one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def plan(workload: DecodeWorkload, device: DeviceSpec | str, planner: str = "splitlab") -> Plan:
    """Ask ``planner`` what it picks for ``workload`` on ``device`` (a ``DeviceSpec`` or preset name)."""
    e = entry(planner)
    dev = get_device(device) if isinstance(device, str) else device
    if workload.kind not in e.kinds:
        raise SplitlabError(f"planner={planner!r} does not cover kind={workload.kind!r}; it covers "
                            f"{', '.join(e.kinds)}")
    return e.adapter(workload, dev)
