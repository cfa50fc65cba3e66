"""Where a fitted planner's constants hold: the shapes and devices of the data they were fitted on.

splitlab's ``splitlab`` planner (``planners.splitlab``) is a cost model whose constants were fitted on measured data
(``splitlab.fit``); outside that data its choices are extrapolations. ``fitted_range(kind, device)`` says what the
data covered for one kernel family, per field: the devices (preset names) and dtypes measured, the ranges of
``batch``, of the keys a request streams (``ctx_len``; sparse MLA: ``topk``, its pool size does not enter the
plan), of the query heads, and of the KV bytes one call reads (the cards cap a grid's calls at ``max_kv_gb``, so
the data thin out at long contexts: the H200's Llama-3-70B data reach batch 128 at 4K keys but batch 32 at 128K).
``check(workload, device)`` compares one plan's shape against it::

    check(workloads.get("llama-3-70b", batch=64, ctx_len=131072), devices.get("h200"))
    # 'outside: batch 64 > 32 fitted at ctx_len 131072 (KV read 34.4 > 17.2 GB)'

The ranges are the ones the constants record: ``splitlab fit`` writes ``ranges_from_rows`` of the rows it read into each
family's ``range`` table of its constants file (``planners.fitted``), and ``fitted_range`` reads the table of the
constants the planner takes for the device (``planners.splitlab.constants_for``: the device's own, a user's file, or the
fallback's); a file without the record has no range (``unknown``). The shipped constants record the range of the
catalog's fit sets (``data/catalog.toml``, role ``fit``), the data they were fitted on (a test holds the two equal). A
range spans every correct measurement (status ``ok``, not the fake timer) of splitlab's kernels in the data: the fit's
shapes and the held-out shapes that scored it. No torch. Source: splitlab (this repository).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from splitlab.errors import SplitlabError
from splitlab.workloads import KERNEL_KINDS

if TYPE_CHECKING:
    import pandas as pd

    from splitlab.devices import DeviceSpec
    from splitlab.workloads import DecodeWorkload

#: The planners whose constants are fitted on measured data (the others are upstream rules, fitted on nothing here).
PLANNERS = ("splitlab",)


def keys_field(kind: str) -> str:
    """The workload field holding the keys a request streams: ``topk`` for sparse MLA, else ``ctx_len``."""
    return "topk" if kind == "sparse_mla" else "ctx_len"


def ranges_from_rows(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per family, the range of ``df``'s correct measurements of splitlab's kernels (see the module docstring):
    ``{"gqa": {"devices": [...], "dtypes": [...], "batch": [lo, hi], "ctx_len": [lo, hi], "heads": [lo, hi],
    "kv_bytes": [lo, hi]}, ...}`` (``topk`` in place of ``ctx_len`` for sparse MLA). Plain ints and strings: it can
    be written into a TOML or JSON constants file as it is."""
    ok = df[df["kernel"].astype(str).isin(list(KERNEL_KINDS)) & (df["status"] == "ok")]
    if "timing" in ok.columns:
        ok = ok[ok["timing"] != "fake"]
    out: dict[str, dict[str, Any]] = {}
    for kernel, g in ok.groupby(ok["kernel"].astype(str)):
        kind = KERNEL_KINDS[kernel]
        keys = keys_field(kind)

        def span(s: pd.Series) -> list[int]:
            return [int(s.min()), int(s.max())]

        out[kind] = {"devices": sorted(map(str, g["device"].dropna().unique())),
                     "dtypes": sorted(map(str, g["dtype"].dropna().unique())),
                     "batch": span(g["batch"]), keys: span(g[keys]), "heads": span(g["num_q_heads"]),
                     "kv_bytes": span(g["kv_bytes"])}
    return out


def fitted_range(kind: str, device: DeviceSpec | str) -> dict[str, Any] | None:
    """The range of the data the constants the ``splitlab`` planner takes for ``device`` (a ``DeviceSpec`` or preset
    name) were fitted on, for family ``kind`` (the fields of ``ranges_from_rows``; ``source`` says where it was
    read), as the constants record it; None where they record none (or there are no constants). Whether
    ``device`` itself lies in the range is ``outside``'s question."""
    from splitlab.planners import splitlab as rule

    try:
        choice = rule.constants_for(device, kind)
    except SplitlabError:
        return None
    recorded = choice.source.ranges.get(kind)
    if not recorded:
        return None
    return {"source": f"the constants {choice.source.label}", "devices": [choice.source.device], **recorded}


def outside(w: DecodeWorkload, dev: DeviceSpec, r: dict[str, Any]) -> list[str]:
    """What of ``w`` on ``dev`` lies outside the range ``r`` (``fitted_range``'s), one phrase each; empty: inside."""
    why = []
    if r.get("devices") and dev.name not in r["devices"]:
        why.append(f"device {dev.name} not fitted ({', '.join(r['devices'])})")
    if r.get("dtypes") and w.dtype not in r["dtypes"]:
        why.append(f"dtype {w.dtype} not fitted ({', '.join(r['dtypes'])})")
    keys = keys_field(w.kind)
    inside = True  # batch and keys each within their range
    for label, value, field in (("batch", w.batch, "batch"), (keys, getattr(w, keys), keys),
                                ("heads", w.num_q_heads, "heads")):
        lo, hi = r.get(field) or (None, None)
        if lo is not None and value < lo:
            why.append(f"{label} {value} < {lo} fitted")
        elif hi is not None and value > hi:
            why.append(f"{label} {value} > {hi} fitted")
        else:
            continue
        if field != "heads":
            inside = False
    lo, hi = r.get("kv_bytes") or (None, None)
    per_request = w.kv_bytes // w.batch
    if inside and hi is not None and w.kv_bytes > hi:  # each in range, but not together: the grids thin out there
        why.append(f"batch {w.batch} > {hi // per_request} fitted at {keys} {getattr(w, keys)} (KV read "
                   f"{w.kv_bytes / 1e9:.3g} > {hi / 1e9:.3g} GB)")
    elif inside and lo is not None and w.kv_bytes < lo:
        why.append(f"KV read {w.kv_bytes / 1e9:.3g} < {lo / 1e9:.3g} GB fitted")
    return why


def check(w: DecodeWorkload, dev: DeviceSpec, planner: str = "splitlab") -> str | None:
    """``"ok"`` when ``w`` on ``dev`` lies inside the data ``planner``'s constants were fitted on, ``"outside: ..."``
    naming what lies outside (``outside``), ``"unknown: ..."`` when that data cannot be found; None for a planner
    whose constants are not fitted on data (``PLANNERS``)."""
    if planner not in PLANNERS:
        return None
    r = fitted_range(w.kind, dev)
    if r is None:
        return "unknown: the constants record no range of their data"
    why = outside(w, dev, r)
    return "outside: " + "; ".join(why) if why else "ok"
