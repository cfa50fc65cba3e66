"""Reading a result set: the oracle (the best measured point per shape), each planner's regret against it,
summaries, and regressions between two result sets or two planners.

A *shape* is one decode call on one device: the kernel, the workload columns (a ragged batch's length
distribution and seed among them), the device and its SM count (``SHAPE``), so a result set may mix devices (or
one preset measured at two SM counts) and each is its own shape. A planner's choice is the measured point whose
``planners`` column names it (the sweep measures every registered planner's choice for every shape). Regret = the
planner's measured p50 over the oracle's p50 on the same shape (1.0 is optimal). Only measured rows count:
``status == "ok"``; rows whose ``timing`` is ``fake`` (modelled, from CI) are refused unless ``allow_fake=True``.
A shape's oracle is over every point of it, work-list points (a ``scheduler`` set: ``bench.impls``) included: the
scheduler is a knob of the point, not part of the shape; a split-count plan replayed is looked up among the
split-count points only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from splitlab import families
from splitlab.bench.impls import KNOB_COLUMNS, resolve
from splitlab.errors import SplitlabError

if TYPE_CHECKING:
    from splitlab.devices import DeviceSpec

SHAPE = ("kernel", "device", "sm_count", "kind", "batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v",
         "ctx_len", "page_size", "topk", "dtype", "length_dist", "length_seed")
KNOBS = KNOB_COLUMNS  # the knob columns of a result row


def shape_cols(df: pd.DataFrame) -> list[str]:
    """The ``SHAPE`` columns ``df`` has: what identifies one decode call on one device."""
    return [c for c in SHAPE if c in df.columns]


def measured(df: pd.DataFrame, *, allow_fake: bool = False) -> pd.DataFrame:
    """The rows that are measurements of a correct output (``status == "ok"``)."""
    if not allow_fake and "timing" in df.columns and (df["timing"] == "fake").any():
        raise SplitlabError("the result set holds modelled (timing='fake') rows; they are not measurements "
                            "(pass allow_fake=True only for demonstrations)")
    return df[df["status"] == "ok"]


def oracle(df: pd.DataFrame, *, allow_fake: bool = False) -> pd.DataFrame:
    """One row per shape: the fastest measured point (its knobs and ``p50_us``)."""
    ok = measured(df, allow_fake=allow_fake)
    if ok.empty:
        return ok.copy()
    idx = ok.groupby(shape_cols(ok), dropna=False)["p50_us"].idxmin()
    return ok.loc[idx.values].reset_index(drop=True)


def planner_choices(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, planner): the point each planner chose, whatever its status. A planner whose rule
    changed between the sessions of a sweep (a resumed sweep measures the new choices and keeps the old rows)
    has several points tagged on a shape; the most recently finished one is its choice here."""
    if "planners" not in df.columns:
        raise SplitlabError("the result set has no 'planners' column; it was not made by `splitlab sweep`")
    picked = df[df["planners"].fillna("") != ""].copy()
    picked["planner"] = picked["planners"].str.split(",")
    picked = picked.explode("planner")
    picked["planner"] = picked["planner"].str.strip()
    if "finished_at" in picked.columns:
        picked = picked.assign(_t=picked["finished_at"].fillna("").astype(str)).sort_values("_t", kind="stable")
        picked = picked.drop(columns="_t")
    keys = [*shape_cols(picked), "planner"]
    picked = picked.drop_duplicates(keys, keep="last").sort_index(kind="stable")
    return picked.reset_index(drop=True)


def regret(df: pd.DataFrame, *, allow_fake: bool = False, replayed: Sequence[str] = ()) -> pd.DataFrame:
    """Per (shape, planner): its measured p50, the oracle's, ``regret = p50 / oracle`` and the two split
    counts. A choice that was not measured correctly (wrong, error) keeps ``regret = NaN`` and its status.

    ``replayed``: registered planners scored by ``replay`` of today's code instead of the data's tags (for a
    rule that changed between the sweep's sessions, e.g. ``splitlab``), on the kernels they were tagged on; a
    plan that was not measured has status ``not measured``. Replay needs one of splitlab's kernels (``families``) and a
    device preset (each shape on its own device): elsewhere (another card's kernel, a GPU that is not a
    preset) the planner keeps its tagged choices."""
    measured(df, allow_fake=allow_fake)  # refuse fake rows up front
    keys = shape_cols(df)
    best = oracle(df, allow_fake=allow_fake)[keys + ["p50_us", "num_splits"]].rename(
        columns={"p50_us": "oracle_us", "num_splits": "oracle_splits"})
    picks = planner_choices(df)[keys + ["planner", "p50_us", "num_splits", "status"]]
    out = picks.merge(best, on=keys, how="left")
    ok = out["status"] == "ok"
    out["regret"] = np.where(ok, out["p50_us"] / out["oracle_us"], np.nan)
    for name in replayed:
        kernels = [k for k in out.loc[out["planner"] == name, "kernel"].unique() if k in families.names()]
        if not kernels:
            continue
        on = df["kernel"].isin(kernels)
        if "device" in df.columns:
            on &= _on_preset(df["device"])
        if not on.any():
            continue
        rep = replay(df[on], name, allow_fake=allow_fake)
        rep = rep[rep["reason"].eq("") | rep["reason"].str.startswith("not measured")]
        rep = rep.assign(status=np.where(rep["regret"].notna(), "ok", "not measured"))
        scope = out["kernel"].isin(kernels)
        if "device" in out.columns:
            scope &= _on_preset(out["device"])
        out = pd.concat([out[(out["planner"] != name) | ~scope], rep[[c for c in out.columns if c in rep.columns]]],
                        ignore_index=True)
    return out


def geomean(x: pd.Series) -> float:
    x = pd.to_numeric(x, errors="coerce").dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


def summary(reg: pd.DataFrame) -> pd.DataFrame:
    """Per planner: shapes, measured choices, geomean / p90 / worst regret, and the shape it loses most on."""
    rows = []
    for name, g in reg.groupby("planner"):
        r = g["regret"].dropna()
        worst = g.loc[r.idxmax()] if len(r) else None
        rows.append(dict(planner=name, shapes=len(g), measured=len(r), geomean=geomean(r),
                         p90=float(r.quantile(0.9)) if len(r) else math.nan,
                         worst=float(r.max()) if len(r) else math.nan,
                         worst_shape=(f"{worst['kind']} B={worst['batch']} H={worst['num_q_heads']} "
                                      f"N={worst['ctx_len']}" + (f" topk={worst['topk']}" if worst['topk'] else ""))
                         if worst is not None else ""))
    return pd.DataFrame(rows).sort_values("geomean").reset_index(drop=True)


def planner_versions(names: Iterable[str]) -> dict[str, str]:
    """The planners of ``names`` that are a release of another of them (``flashinfer-0.7.4`` of ``flashinfer``:
    the other's name, a dash, a version number): name -> the other."""
    names = [str(n) for n in names]
    return {n: b for n in names for b in names
            if n != b and n.startswith(b + "-") and n[len(b) + 1:][:1].isdigit()}


def version_twins(df: pd.DataFrame) -> dict[str, tuple[str, int, int]]:
    """For each planner of ``df`` that is a release of another (``planner_versions``) and shares shapes with it:
    ``(the other, shapes where both chose, shapes where their choices differ)``. A choice is the point's knobs
    (``KNOBS``); a planner whose choices differ on no shared shape can be shown once, as the other."""
    if df.empty or "planners" not in df.columns:
        return {}
    ch = planner_choices(df)
    if ch.empty:
        return {}
    keys = shape_cols(ch)
    knobs = [c for c in KNOBS if c in ch.columns]
    ch = ch.assign(_knobs=["|".join(map(str, t)) for t in ch[knobs].itertuples(index=False)])
    out = {}
    for name, base in planner_versions(ch["planner"].unique()).items():
        m = ch[ch["planner"] == base][[*keys, "_knobs"]].merge(ch[ch["planner"] == name][[*keys, "_knobs"]],
                                                              on=keys, suffixes=("", "_v"))
        if len(m):
            out[name] = (base, len(m), int((m["_knobs"] != m["_knobs_v"]).sum()))
    return out


def merged_versions(twins: dict[str, tuple[str, int, int]]) -> dict[str, str]:
    """Of ``version_twins``: the planners that choose as the other on every shared shape, each with the sentence
    that says so (``{"flashinfer-0.7.4": "flashinfer-0.7.4 chose what flashinfer chose on all 348 shapes ..."}``):
    a figure or table shows them once, as the other."""
    return {name: f"{name} chose what {base} chose on all {shared} shapes where both were recorded: shown once, "
                  f"as {base}" for name, (base, shared, differ) in twins.items() if differ == 0}


def twins_note(twins: dict[str, tuple[str, int, int]]) -> str:
    """One sentence per pair of ``version_twins``: shown once (``merged_versions``), or how often they differ."""
    merged = merged_versions(twins)
    return " ".join(merged[name] + "." if name in merged else f"{name} and {base} chose differently on {differ} "
                    f"of the {shared} shapes where both were recorded."
                    for name, (base, shared, differ) in twins.items())


def coverage(reg: pd.DataFrame, df: pd.DataFrame, by: Sequence[str] = ("kernel",), *,
             allow_fake: bool = False) -> pd.DataFrame:
    """Why a planner is scored on fewer shapes than its panel holds (a panel: the rows of ``reg``, ``regret``'s
    output, that share ``by``). One row per (panel, planner) scored on fewer: the panel's ``shapes``, the
    planner's ``scored`` ones, and ``why``: its choices that were not measured correctly (wrong, error; a replayed
    plan that the grid did not sweep, with the knobs that plan shares), and the shapes where the data hold no
    choice of it: those its rule does not plan (replayed on ``df``, the rows ``reg`` came from: its own error) or,
    where it does plan them, that the sweeps of those shapes did not record its choice."""
    keys = [c for c in shape_cols(reg) if c not in by]
    rows = []
    for panel, g in reg.groupby(list(by), dropna=False):
        panel = panel if isinstance(panel, tuple) else (panel,)
        shapes = g[list(by) + keys].drop_duplicates()
        for planner, p in g.groupby("planner"):
            scored = int(p["regret"].notna().sum())
            if scored >= len(shapes):
                continue
            why = []
            bad = p[p["regret"].isna()]
            for status, b in bad.groupby("status"):
                if status == "not measured":
                    why.append(f"{len(b)} of its plans were not in the swept grid{_plan_knobs(b, df, planner)}")
                else:
                    why.append(f"{len(b)} of its choices measured {status}")
            missing = shapes.merge(p[list(by) + keys].drop_duplicates().assign(_has=1), how="left",
                                   on=list(by) + keys)
            missing = missing[missing["_has"].isna()].drop(columns="_has")
            if len(missing):
                why.append(_why_no_choice(missing, df, planner, allow_fake=allow_fake))
            rows.append(dict(zip(by, panel, strict=True), planner=planner, shapes=len(shapes), scored=scored,
                             why="; ".join(why)))
    return pd.DataFrame(rows, columns=[*by, "planner", "shapes", "scored", "why"])


def _rows_of(df: pd.DataFrame, shapes: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in shape_cols(df) if c in shapes.columns]
    return df.merge(shapes[keys].drop_duplicates(), on=keys)


def _plan_knobs(bad: pd.DataFrame, df: pd.DataFrame, planner: str) -> str:
    """The knobs every one of a replayed planner's unmeasured plans shares besides the split count (``, each at
    block_h=64, ...``), or "" when it cannot be replayed here."""
    from splitlab import planners

    if planner not in planners.names():
        return ""
    try:
        rep = replay(_rows_of(df, bad), planner, allow_fake=True)
    except SplitlabError:
        return ""
    reasons = rep.loc[rep["reason"].str.startswith("not measured"), "reason"]
    sets = [set(r.removeprefix("not measured: ").split(", ")) for r in reasons]
    common = sorted({t for t in set.intersection(*sets) if not t.startswith("num_splits=")}) if sets else []
    return f" (each at {', '.join(common)})" if common else ""


def _why_no_choice(missing: pd.DataFrame, df: pd.DataFrame, planner: str, *, allow_fake: bool) -> str:
    """Why ``planner`` has no choice on the ``missing`` shapes: replayed where it can be (a registered planner, one
    of splitlab's kernels), its rule refuses them or the sweeps did not record its choice."""
    from splitlab import planners

    rep = pd.DataFrame(columns=["reason"])
    if planner in planners.names():
        try:
            rep = replay(_rows_of(df, missing), planner, allow_fake=allow_fake)
        except SplitlabError:
            pass
    refused = rep[rep["reason"].astype(str).str.startswith("planner:")]
    counts = [("refused", len(refused)), ("planned", len(rep) - len(refused)), ("unknown", len(missing) - len(rep))]
    parts = []
    for what, k in counts:
        if k <= 0:
            continue
        shapes = f"{k} shape{'s' if k != 1 else ''}"
        if what == "refused":
            first = refused["reason"].iloc[0].removeprefix("planner: ")
            parts.append(f"its rule does not plan {shapes} (e.g. {first})")
        elif what == "planned":
            parts.append(f"the sweeps of {shapes} did not record its choice")
        else:
            parts.append(f"no choice of it was recorded on {shapes}")
    return "; ".join(parts)


def compare(base: pd.DataFrame, cand: pd.DataFrame, *, base_planner: str | None = None,
            cand_planner: str | None = None, allow_fake: bool = False, replayed: Sequence[str] = ()
            ) -> pd.DataFrame:
    """Per shape present in both: the baseline's and the candidate's time (a planner's choice when a planner is
    named, else the set's oracle) and ``ratio = cand / base`` (> 1: the candidate is slower), slowest first.
    ``replayed`` as in ``regret``."""
    keys = [c for c in shape_cols(base) if c in cand.columns]

    def pick(df: pd.DataFrame, planner: str | None) -> pd.DataFrame:
        if planner is None:
            t = oracle(df, allow_fake=allow_fake)
        else:
            r = regret(df, allow_fake=allow_fake, replayed=replayed)
            t = r[(r["planner"] == planner) & r["p50_us"].notna()]
            if t.empty:
                have = ", ".join(sorted(r["planner"].unique())) or "no planner's choice"
                raise SplitlabError(f"planner={planner!r} made no choice in this result set; it has {have}")
        return t[keys + ["p50_us", "num_splits"]]

    m = pick(base, base_planner).merge(pick(cand, cand_planner), on=keys, suffixes=("_base", "_cand"))
    m["ratio"] = m["p50_us_cand"] / m["p50_us_base"]
    return m.sort_values("ratio", ascending=False).reset_index(drop=True)


_RULE_COLUMNS = ["ctas", "sm_count", "p50_small", "p50_large", "best", "rule", "decisive", "predicted", "gain_small"]


def cta_rule(df: pd.DataFrame, *, sm_count: int | None = None, knob: str = "block_k", small: int = 32,
             large: int = 64, tol: float = 0.01) -> pd.DataFrame:
    """Seed 003's rule ``BLOCK_K = small if ctas > SMs else large`` scored on measured load points.

    A load point is one shape at one split count (and the other knobs equal) where both ``knob`` values were
    measured ``ok``; its CTAs are those of the launch (the same for both values). Per load point: both p50s,
    the faster value (``best``; ``tie`` when they differ by less than ``tol``; ``decisive`` otherwise), the
    rule's pick, whether the rule picked the faster one (``predicted``; a tie counts as predicted) and
    ``gain_small`` (p50 at the large value over p50 at the small one). ``sm_count`` defaults to the rows'."""
    ok = df[(df["status"] == "ok") & df[knob].isin([small, large]) & df["ctas"].notna()].copy()
    if ok.empty:
        return pd.DataFrame(columns=_RULE_COLUMNS)
    keys = [c for c in (*SHAPE, *KNOBS) if c in ok.columns and c != knob]
    ok = ok.sort_values("p50_us").drop_duplicates(keys + [knob])
    wide = ok.pivot_table(index=keys, columns=knob, values="p50_us", aggfunc="min", dropna=False)
    wide = wide.dropna(subset=[c for c in (small, large) if c in wide.columns])
    if wide.empty or small not in wide.columns or large not in wide.columns:
        return pd.DataFrame(columns=_RULE_COLUMNS)
    ctas = ok.groupby(keys, dropna=False)["ctas"].max()
    sms = ok.groupby(keys, dropna=False)["sm_count"].max() if "sm_count" in ok.columns else None
    out = wide.rename(columns={small: "p50_small", large: "p50_large"})[["p50_small", "p50_large"]].reset_index()
    out["ctas"] = ctas.reindex(wide.index).to_numpy()
    out["sm_count"] = sm_count if sm_count else (sms.reindex(wide.index).to_numpy() if sms is not None else None)
    rel = out["p50_small"] / out["p50_large"]
    out["best"] = [small if r < 1 - tol else large if r > 1 + tol else "tie" for r in rel]
    out["rule"] = [small if c > s else large for c, s in zip(out["ctas"], out["sm_count"], strict=True)]
    out["decisive"] = out["best"] != "tie"
    out["predicted"] = [(b == "tie") or (b == r) for b, r in zip(out["best"], out["rule"], strict=True)]
    out["gain_small"] = 1 / rel  # > 1 when the small value is faster
    return out


# --- replay: the what-if regret of a planner that did not exist when the data were taken ---------------------

def _launch_facts_fn(kernel: str):
    """The ``*_launch_facts`` of splitlab's kernel ``kernel`` (its family's, ``families.get``): what ``replay``
    resolves launches with."""
    return resolve(families.get(kernel).launch_facts)


def resolve_knobs(kernel: str, w, plan, device) -> dict:
    """The knobs the sweep records for ``plan`` on ``kernel``: the plan's split count and the tiles it sets,
    everything else resolved by the kernel's ``*_launch_facts`` exactly as the launcher does (the kernel's
    defaults). A tile the kernel does not have (e.g.
    ``block_k`` on a dense kernel) is ignored."""
    facts_fn = _launch_facts_fn(kernel)
    kw = dict(num_splits=plan.num_splits, device=device)
    kw.update({t: getattr(plan, t) for t in families.get(kernel).plan_tiles})  # the tiles its launcher takes
    f = facts_fn(w, **kw)
    return {k: getattr(f, k, None) for k in KNOBS}


class MeasuredIndex:
    """The measured points of a result set, indexed for ``replay``: per shape (``SHAPE`` columns) the best
    ``ok`` p50 of each distinct knob tuple (``KNOBS``; missing knobs are ``None``) of its split-count points, and the
    oracle over all of its points (work-list points too: their knob tuple then ends with the scheduler)."""

    def __init__(self, df: pd.DataFrame, *, allow_fake: bool = False):
        ok = measured(df, allow_fake=allow_fake)
        ok = ok[ok["kernel"].isin(families.names())]
        self.keys = [c for c in SHAPE if c in df.columns]
        self.times: dict[tuple, dict[tuple, float]] = {}
        self.rows: dict[tuple, dict] = {}
        knob_cols = [c for c in KNOBS if c in ok.columns]
        sched_col = ["scheduler"] if "scheduler" in ok.columns else []
        #: per shape, the fastest work-list point: (p50, its knob tuple + (scheduler,)), beside ``times``
        self.scheduled: dict[tuple, tuple[float, tuple]] = {}
        for rec in ok[self.keys + knob_cols + sched_col + ["p50_us"]].to_dict("records"):
            shape = tuple(_py(rec[c]) for c in self.keys)
            knobs = tuple(_py(rec.get(c)) for c in KNOBS)
            t = self.times.setdefault(shape, {})
            p = float(rec["p50_us"])
            sched = _py(rec.get("scheduler"))
            if sched:  # not a split-count launch: never a replayed plan's, but the oracle may be it
                if shape not in self.scheduled or p < self.scheduled[shape][0]:
                    self.scheduled[shape] = (p, (*knobs, sched))
            elif knobs not in t or p < t[knobs]:
                t[knobs] = p
            self.rows.setdefault(shape, {c: shape[i] for i, c in enumerate(self.keys)})
        self._facts: dict[tuple, dict] = {}

    def shapes(self) -> list[tuple]:
        return list(self.times)

    def only(self, shapes: Iterable[tuple]) -> MeasuredIndex:
        """The same index cut to ``shapes`` (sharing its rows and its cache of resolved knobs)."""
        sub = copy.copy(self)
        sub.times = {sh: self.times[sh] for sh in shapes}
        return sub

    def oracle(self, shape: tuple) -> tuple[float, tuple]:
        """(best p50, its knob tuple) of ``shape``, over every point (a work-list point's tuple ends with its
        scheduler)."""
        best = min(((t, knobs) for knobs, t in self.times[shape].items()), key=lambda x: x[0], default=None)
        sched = self.scheduled.get(shape)
        if best is None or (sched is not None and sched[0] < best[0]):
            return sched  # type: ignore[return-value]
        return best

    def workload(self, shape: tuple):
        """The ``DecodeWorkload`` of ``shape``, its lengths included (``results.workload``): a rule replayed on a
        ragged batch sees the batch, not its longest request repeated."""
        from splitlab.results import workload

        return workload(self.rows[shape])

    def lookup(self, shape: tuple, plan, device) -> tuple[dict, float | None]:
        """(the resolved knobs of ``plan`` on ``shape``, the measured p50 at exactly those knobs or None)."""
        row = self.rows[shape]
        ck = (shape, plan.num_splits, plan.block_n, plan.block_k, plan.block_h, getattr(device, "name", device))
        if ck not in self._facts:
            self._facts[ck] = resolve_knobs(row["kernel"], self.workload(shape), plan, device)
        knobs = self._facts[ck]
        return knobs, self.times[shape].get(tuple(knobs[k] for k in KNOBS))


def _py(v):
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _on_preset(device: pd.Series) -> pd.Series:
    """Per row, whether ``device`` names a device preset (each distinct name looked up once)."""
    from splitlab.devices import get as get_device

    presets = []
    for name in device.dropna().unique():
        try:
            get_device(str(name))
        except SplitlabError:
            continue
        presets.append(name)
    return device.isin(presets)


def _shape_device(row: dict):
    """The device a shape was measured on: the preset its ``device`` column names, at the ``sm_count`` the rows
    record when that differs (``devices.detect`` keeps a preset's name for a card with another SM count)."""
    from dataclasses import replace as dc_replace

    from splitlab.devices import get as get_device

    name = row.get("device")
    if name is None:
        raise SplitlabError("the shape has no device; pass device= (one preset) to replay it")
    dev = get_device(str(name))
    sms = row.get("sm_count")
    return dc_replace(dev, sm_count=int(sms)) if sms is not None and int(sms) != dev.sm_count else dev


def data_device(df: pd.DataFrame) -> DeviceSpec:
    """The device preset (``DeviceSpec``) of the rows' ``device`` column; rows of several devices are refused."""
    from splitlab.devices import get as get_device

    names = df["device"].dropna().unique() if "device" in df.columns else []
    if len(names) != 1:
        raise SplitlabError(f"the result set has devices {list(names)}; pass device= (one preset) to replay it")
    return get_device(str(names[0]))


def replay(df: pd.DataFrame | MeasuredIndex, planner, *, device=None, allow_fake: bool = False,
           name: str | None = None) -> pd.DataFrame:
    """What-if regret of ``planner`` (a registered name or a function ``(DecodeWorkload, DeviceSpec) -> Plan``)
    on the measured points of ``df``, one row per shape of splitlab's kernels (``families``).

    Per shape: ask the planner for its plan on ``device`` (default: each shape's own device, the preset its
    ``device`` column names at the rows' ``sm_count``, so mixed-device data replay each device on itself),
    resolve the knobs the sweep would have recorded for it (``resolve_knobs``: its split count, the tiles it
    sets, the kernel's defaults otherwise), and look up the ``ok`` point with exactly those knobs. Columns: the
    shape, ``planner``, the resolved knobs, ``p50_us``, ``oracle_us``, ``oracle_splits``, ``regret = p50_us /
    oracle_us`` and ``reason``: "" when scored, else why not (the plan was not measured, the planner raised /
    does not cover the kind, or the shape's device is not a preset); those rows keep ``regret = NaN``."""
    from splitlab.devices import DeviceSpec
    from splitlab.devices import get as get_device
    from splitlab.planners import plan as plan_by_name

    idx = df if isinstance(df, MeasuredIndex) else MeasuredIndex(df, allow_fake=allow_fake)
    if device is None and "device" not in idx.keys:
        raise SplitlabError("the result set has no device column; pass device= (one preset) to replay it")
    fixed = None if device is None else device if isinstance(device, DeviceSpec) else get_device(str(device))
    if isinstance(planner, str):
        label = name or planner

        def ask(w, dev):
            return plan_by_name(w, dev, planner)
    else:
        label = name or getattr(planner, "__name__", "planner")

        def ask(w, dev):
            return planner(w, dev)

    out = []
    for shape in idx.shapes():
        rec = dict(idx.rows[shape], planner=label)
        best, best_knobs = idx.oracle(shape)
        rec.update(oracle_us=best, oracle_splits=best_knobs[0], p50_us=math.nan, regret=math.nan, reason="")
        try:
            dev = fixed or _shape_device(idx.rows[shape])
            p = ask(idx.workload(shape), dev)
            knobs, t = idx.lookup(shape, p, dev)
        except SplitlabError as e:
            rec["reason"] = f"planner: {e}"
            out.append(rec)
            continue
        rec.update(knobs)
        if t is None:
            rec["reason"] = "not measured: " + ", ".join(f"{k}={v}" for k, v in knobs.items() if v is not None)
        else:
            rec.update(p50_us=t, regret=t / best)
        out.append(rec)
    cols = idx.keys + ["planner", *KNOBS, "p50_us", "oracle_us", "oracle_splits", "regret", "reason"]
    return pd.DataFrame(out, columns=cols)
