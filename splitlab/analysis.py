"""Reading a result set: the oracle (the best measured point per shape), each planner's regret against it,
summaries, and regressions between two result sets or two planners.

A *shape* is one decode call on one device: the kernel, the workload columns and the device. A planner's
choice is the measured point whose ``planners`` column names it (the sweep measures every registered
planner's choice for every shape). Regret = the planner's measured p50 over the oracle's p50 on the same
shape (1.0 is optimal). Only measured rows count: ``status == "ok"``; rows whose ``timing`` is ``fake``
(modelled, from CI) are refused unless ``allow_fake=True``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from splitlab.errors import SplitlabError

SHAPE = ("kernel", "device", "kind", "batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len",
         "page_size", "topk", "dtype")
KNOBS = ("num_splits", "block_n", "block_k", "block_h", "num_warps", "num_stages")


def _shape_cols(df: pd.DataFrame) -> list[str]:
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
    idx = ok.groupby(_shape_cols(ok), dropna=False)["p50_us"].idxmin()
    return ok.loc[idx.values].reset_index(drop=True)


def planner_choices(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, planner): the point each planner chose, whatever its status."""
    if "planners" not in df.columns:
        raise SplitlabError("the result set has no 'planners' column; it was not made by `splitlab sweep`")
    picked = df[df["planners"].fillna("") != ""].copy()
    picked["planner"] = picked["planners"].str.split(",")
    picked = picked.explode("planner")
    picked["planner"] = picked["planner"].str.strip()
    return picked.reset_index(drop=True)


def regret(df: pd.DataFrame, *, allow_fake: bool = False) -> pd.DataFrame:
    """Per (shape, planner): its measured p50, the oracle's, ``regret = p50 / oracle`` and the two split
    counts. A choice that was not measured correctly (wrong, error) keeps ``regret = NaN`` and its status."""
    measured(df, allow_fake=allow_fake)  # refuse fake rows up front
    keys = _shape_cols(df)
    best = oracle(df, allow_fake=allow_fake)[keys + ["p50_us", "num_splits"]].rename(
        columns={"p50_us": "oracle_us", "num_splits": "oracle_splits"})
    picks = planner_choices(df)[keys + ["planner", "p50_us", "num_splits", "status"]]
    out = picks.merge(best, on=keys, how="left")
    ok = out["status"] == "ok"
    out["regret"] = np.where(ok, out["p50_us"] / out["oracle_us"], np.nan)
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


def compare(base: pd.DataFrame, cand: pd.DataFrame, *, base_planner: str | None = None,
            cand_planner: str | None = None, allow_fake: bool = False) -> pd.DataFrame:
    """Per shape present in both: the baseline's and the candidate's time (a planner's choice when a planner is
    named, else the set's oracle) and ``ratio = cand / base`` (> 1: the candidate is slower), slowest first."""
    keys = [c for c in _shape_cols(base) if c in cand.columns]

    def pick(df: pd.DataFrame, planner: str | None) -> pd.DataFrame:
        if planner is None:
            t = oracle(df, allow_fake=allow_fake)
        else:
            r = regret(df, allow_fake=allow_fake)
            t = r[r["planner"] == planner]
            if t.empty:
                raise SplitlabError(f"planner={planner!r} made no choice in this result set; it has "
                                    f"{', '.join(sorted(r['planner'].unique()))}")
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
