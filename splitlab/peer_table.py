"""The kernel comparison: splitlab's decode kernels beside the peers' on the same shapes, from the sweeps of the
cards' ``peers`` grids (``splitlab sweep <card> --grid peers``), with the roofline of each.

One row per (shape, implementation) in ``roles(df)``; the implementations ("roles") of a family:

* GQA: ``splitlab (planner)`` (gqa_decode at its planner's default: the point tagged ``splitlab``), ``splitlab
  (best)`` (the fastest gqa_decode point), ``FlashInfer (own plan)`` (flashinfer_decode at the split FlashInfer's
  own plan runs, ``peers_flashinfer.tc_decode_plan``), ``FlashInfer (best split)``, ``SDPA cuDNN``, ``SDPA flash``.
* MLA: ``splitlab (planner)``, ``splitlab (best)``, ``FlashMLA``, ``FlashInfer MLA fa3``, ``FlashInfer MLA fa2``.

The peers of a family, their cards and how each one's row is picked are its record's ``peers``
(``splitlab.families``); a family is named by its kind (the ``family`` column: ``gqa``, ``mla``).

Per row: ``p50_us``, ``gbps`` (unique KV bytes / time), ``tflops`` (matrix FLOPs / time), ``roofline`` (the floor
``max(bytes / read ceiling, FLOPs / matrix ceiling)`` of the device preset over the time: 1.0 is the floor).
``comparison`` puts each shape on one line with the best peer and splitlab's speed-up over it; ``summary`` gives
each family's geomean speed-up and its worst shape.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from splitlab import devices, families
from splitlab.analysis import geomean
from splitlab.errors import SplitlabError
from splitlab.workloads import floor_time_us

SPLITLAB_PLANNER, SPLITLAB_BEST = "splitlab (planner)", "splitlab (best)"
#: Columns that name a shape across sweeps (the SDPA peers read a contiguous cache: no page size).
SHAPE = ["kind", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "batch", "ctx_len", "dtype"]


def _workload(row: pd.Series):
    from splitlab.results import workload

    return workload(row)


def _own_plan_splits(row: pd.Series) -> int:
    from splitlab.bench.peers_flashinfer import tc_decode_plan

    return tc_decode_plan(_workload(row), int(row["sm_count"])).num_splits


def _pick(ok: pd.DataFrame, how: str) -> pd.DataFrame:
    """One row per shape of one card's measured rows, chosen by ``how`` (``families.PICKS``; ``planner``: the
    point tagged ``splitlab``)."""
    if ok.empty:
        return ok
    if how == "own":
        ok = ok[ok["num_splits"] == ok.apply(_own_plan_splits, axis=1)]
    elif how == "planner":
        tags = ok["planners"].fillna("").str.split(",")
        ok = ok[tags.map(lambda t: "splitlab" in [x.strip() for x in t])]
    if ok.empty:
        return ok
    return ok.loc[ok.groupby(SHAPE, dropna=False)["p50_us"].idxmin().values]


def roles(df: pd.DataFrame, *, device: str = "h200", allow_fake: bool = False) -> pd.DataFrame:
    """One row per (shape, role) of every family whose splitlab card is in ``df`` (measured ``ok`` rows only):
    the shape columns, ``family``, ``role``, ``kernel``, ``num_splits``, ``p50_us``, ``gbps``, ``tflops``,
    ``roofline``. Ceilings: the ``device`` preset's (``roofline_gbps``, ``roofline_tflops``). Modelled rows (the
    fake timer) are refused unless ``allow_fake``."""
    if not allow_fake and "timing" in df.columns and (df["timing"] == "fake").any():
        raise SplitlabError("the result set holds modelled (timing='fake') rows; a kernel comparison needs "
                            "measurements")
    dev = devices.get(device)
    ok = df[df["status"] == "ok"]
    parts = []
    for fam in families.ALL:
        mine = fam.name
        if not fam.peers or not (ok["kernel"] == mine).any():
            continue
        for role, kernel, how in [(SPLITLAB_PLANNER, mine, "planner"), (SPLITLAB_BEST, mine, "best"),
                                  *((p.role, p.card, p.pick) for p in fam.peers)]:
            rows = _pick(ok[ok["kernel"] == kernel], how)
            if not rows.empty:
                parts.append(rows.assign(family=fam.kind, role=role))
    if not parts:
        return pd.DataFrame(columns=[*SHAPE, "family", "role", "kernel", "num_splits", "p50_us", "gbps", "tflops",
                                     "roofline"])
    out = pd.concat(parts, ignore_index=True)
    ws = [_workload(r) for _, r in out.iterrows()]
    us = out["p50_us"].astype(float).to_numpy()
    out["gbps"] = [w.kv_bytes / (t * 1e3) for w, t in zip(ws, us, strict=True)]
    out["tflops"] = [w.flops / (t * 1e6) for w, t in zip(ws, us, strict=True)]
    out["floor_us"] = [floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops) for w in ws]
    out["roofline"] = out["floor_us"] / us
    keep = [*SHAPE, "family", "role", "kernel", "impl", "num_splits", "p50_us", "gbps", "tflops", "floor_us",
            "roofline"]
    return out[[c for c in keep if c in out.columns]].reset_index(drop=True)


def comparison(r: pd.DataFrame) -> pd.DataFrame:
    """One line per (family, shape with a peer measured): each role's ``p50_us`` (a column per role), the best peer
    and its time, and splitlab's speed-up over it at its planner's default (``speedup_planner``) and at its best
    (``speedup_best``): the best peer's time over splitlab's (above 1: splitlab is faster)."""
    if r.empty:
        return pd.DataFrame()
    lines = []
    for family, g in r.groupby("family", sort=False):
        peers = [p.role for p in families.by_kind(family).peers]
        wide = g.pivot_table(index=SHAPE, columns="role", values="p50_us", aggfunc="min")
        have = [p for p in peers if p in wide.columns]
        wide = wide[wide[have].notna().any(axis=1)] if have else wide.iloc[:0]
        if wide.empty:  # no shape of this family with a peer measured
            continue
        best = wide[have].idxmin(axis=1)
        wide["best_peer"] = best
        wide["best_peer_us"] = wide[have].min(axis=1)
        for col, role in (("speedup_planner", SPLITLAB_PLANNER), ("speedup_best", SPLITLAB_BEST)):
            wide[col] = wide["best_peer_us"] / wide[role] if role in wide.columns else np.nan
        wide = wide.reset_index()
        wide.insert(0, "family", family)
        lines.append(wide)
    out = pd.concat(lines, ignore_index=True) if lines else pd.DataFrame()
    out.columns.name = None
    return out


def shape_label(row: pd.Series) -> str:
    heads = f"{row['num_q_heads']}/{row['num_kv_heads']}" if row["kind"] == "gqa" else f"{row['num_q_heads']}h"
    n = int(row["ctx_len"])
    return f"{heads} B={row['batch']} N={n // 1024}K" if n % 1024 == 0 else f"{heads} B={row['batch']} N={n}"


def summary(cmp: pd.DataFrame) -> pd.DataFrame:
    """Per family: shapes, splitlab's geomean speed-up over the best peer (at its planner's default and at its
    best), the shapes it wins (planner's default), its worst shape and that shape's best peer."""
    rows = []
    for family, g in cmp.groupby("family", sort=False):
        s = g["speedup_planner"].dropna()
        worst = g.loc[s.idxmin()] if len(s) else None
        rows.append(dict(family=family, shapes=len(g), geomean_planner=geomean(g["speedup_planner"]),
                         geomean_best=geomean(g["speedup_best"]), wins_planner=int((s > 1).sum()),
                         worst=float(s.min()) if len(s) else math.nan,
                         worst_shape=shape_label(worst) if worst is not None else "",
                         worst_peer=worst["best_peer"] if worst is not None else ""))
    return pd.DataFrame(rows)


def markdown(r: pd.DataFrame, cmp: pd.DataFrame) -> str:
    """The comparison as Markdown: per family, a line per shape with each role's time (us) and roofline
    fraction, the best peer and splitlab's speed-ups; then the full per-role table (us, GB/s, TFLOP/s,
    roofline, split)."""
    out = []
    for family, g in cmp.groupby("family", sort=False):
        roles_ = [SPLITLAB_PLANNER, SPLITLAB_BEST] + [p.role for p in families.by_kind(family).peers]
        roles_ = [x for x in roles_ if x in g.columns]
        frac = r[r["family"] == family].set_index([*SHAPE, "role"])["roofline"]
        out.append(f"### {family.upper()}: time in us (roofline fraction)\n")
        out.append("| shape | " + " | ".join(roles_) + " | best peer | speed-up (planner) | speed-up (best) |")
        out.append("|---" * (len(roles_) + 4) + "|")
        for _, row in g.iterrows():
            key = tuple(row[c] for c in SHAPE)
            cells = []
            for role in roles_:
                us = row[role]
                fr = frac.get((*key, role), np.nan)
                cells.append("" if pd.isna(us) else f"{us:.1f} ({fr:.2f})")
            out.append(f"| {shape_label(row)} | " + " | ".join(cells) + f" | {row['best_peer']} | "
                       f"{row['speedup_planner']:.2f} | {row['speedup_best']:.2f} |")
        out.append("")
    out.append("<details><summary>Every implementation per shape: us, GB/s, TFLOP/s, roofline fraction, split</summary>"
               "\n")
    out.append("| family | shape | implementation | split | us | GB/s | TFLOP/s | roofline |")
    out.append("|---|---|---|---|---|---|---|---|")
    for _, row in r.iterrows():
        split = "" if pd.isna(row.get("num_splits")) else str(int(row["num_splits"]))
        out.append(f"| {row['family']} | {shape_label(row)} | {row['role']} | {split} | {row['p50_us']:.1f} | "
                   f"{row['gbps']:.0f} | {row['tflops']:.1f} | {row['roofline']:.2f} |")
    out.append("\n</details>")
    return "\n".join(out)
