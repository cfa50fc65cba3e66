"""Scoring split rules on measured data: which shapes are held out, and every planner's regret on them.

**The split.** A shape is *held out* when any of these holds (``held_out``), and only the other (*fit*)
shapes are ever passed to the fit:

- its batch is 2 or 32 (other batches),
- its context is 4096 or 65536 keys (other contexts; dense kernels only: sparse MLA's context is the
  token pool, fixed at 65536 in the data, and its keys are the top-k),
- its query-head count is in ``HELD_HEADS[kind]`` (GQA 64 (Llama-3-70B, 64/8), MLA 32, sparse MLA 64 and 96;
  sparse MLA's 32 heads are fit shapes: theirs is the only default tile that is not the Gluon one on the H200,
  so only they price the 16-row tile against the tl kernel),
- its batch is ragged with lengths drawn from a distribution in ``HELD_LENGTHS`` (``spread4``: other spreads than
  the fit's ``spread16``).

``split(df)`` cuts the rows, not just the shapes, so the fit never sees a held-out measurement (not even
through the oracle).

**The scores.** ``shootout(df)`` scores every planner per kernel, set (``fit`` / ``held-out``) and lengths (``uniform``
and ``ragged`` batches apart, ``lengths_of``): ported planners from the data's own choices, splitlab's rules replayed
(``analysis.replay``); ``goal(table)`` says per kernel and lengths whether splitlab's rule meets the issue's goal. The
fit (``splitlab.fit``) prints both after fitting, and the report's headline (``splitlab.headline``) is built from
them::

    from splitlab import results, scoring
    table = scoring.shootout(results.load_points("h200"))
    scoring.goal(table)          # geomean, worst and the best ported rule per kernel and lengths
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from splitlab import analysis
from splitlab.planners.fitted import CostConstants
from splitlab.workloads import KERNEL_KINDS, UNIFORM

HELD_BATCHES = (2, 32)
HELD_CTX = (4096, 65536)
HELD_HEADS = {"gqa": (64,), "mla": (32,), "sparse_mla": (64, 96)}
#: Length distributions held out (``workloads.LENGTH_DISTS``): ragged batches of another spread than the fit's.
HELD_LENGTHS = ("spread4",)

#: splitlab's first, unfitted rule, as the shootout names it (replayed beside the fitted one).
OLD_NAME = "splitlab-v0"


def held_out(df: pd.DataFrame) -> pd.Series:
    """True for the rows of held-out shapes (see the module docstring)."""
    kind = df["kind"].astype(str)
    dense = kind.isin(["gqa", "mla"])
    heads = pd.Series([h in HELD_HEADS.get(k, ()) for k, h in zip(kind, df["num_q_heads"], strict=True)],
                      index=df.index, dtype=bool)
    spread = df["length_dist"].isin(HELD_LENGTHS) if "length_dist" in df else False
    return (df["batch"].isin(HELD_BATCHES) | (dense & df["ctx_len"].isin(HELD_CTX)) | heads | spread
            ).fillna(False).astype(bool)


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fit rows, held-out rows) of ``df``."""
    h = held_out(df)
    return df[~h].copy(), df[h].copy()


#: How the shootout sorts shapes by their lengths (``lengths_of``): every request of a batch the longest, or not.
LENGTHS = ("uniform", "ragged")


def lengths_of(df: pd.DataFrame) -> pd.Series:
    """``uniform`` or ``ragged`` per row of ``df`` (shapes or result rows): ragged where its ``length_dist`` is a
    distribution other than ``uniform`` (``workloads.LENGTH_DISTS``); rows without one, and data without the
    column (swept before ragged batches), are uniform."""
    if "length_dist" not in df:
        return pd.Series(LENGTHS[0], index=df.index, dtype=object)
    uniform = df["length_dist"].fillna(UNIFORM).astype(str) == UNIFORM
    return pd.Series(np.where(uniform, LENGTHS[0], LENGTHS[1]), index=df.index, dtype=object)


def shootout(df: pd.DataFrame, constants: dict[str, CostConstants] | None = None, *,
             new_name: str = "splitlab", allow_fake: bool = False, part: str | None = None) -> pd.DataFrame:
    """Per kernel, set (``fit`` / ``held-out``, or ``part`` for every shape), lengths (``uniform`` or ``ragged``
    batches, ``lengths_of``: scored apart, so that neither hides the other) and planner: shapes, measured
    choices, geomean / p90 / worst regret. Ported planners are scored from the data's own ``planners`` column;
    splitlab's rules by ``analysis.replay`` of the code: the fitted rule (with ``constants``, default
    those the planner takes for the data's device, ``planners.splitlab.constants_for``) as ``new_name``, the first,
    unfitted rule as ``splitlab-v0``. (The data's own
    ``splitlab`` tags are left out: the rule changed while the shipped sweeps were made, so they mix its
    versions.)"""
    from splitlab.planners.splitlab import fitted_plan, plan_splitlab_v0

    df = df[df["kernel"].isin(list(KERNEL_KINDS))]
    reg = analysis.regret(df, allow_fake=allow_fake)
    reg = reg[~reg["planner"].str.contains("@", regex=False) & (reg["planner"] != "splitlab")]

    def new_rule(w, dev):
        return fitted_plan(w, dev, None if constants is None else constants[w.kind], name=new_name)

    idx = analysis.MeasuredIndex(df, allow_fake=allow_fake)
    dev = analysis.data_device(analysis.measured(df, allow_fake=allow_fake))
    rep = pd.concat([analysis.replay(idx, new_rule, name=new_name, device=dev),
                     analysis.replay(idx, plan_splitlab_v0, name=OLD_NAME, device=dev)], ignore_index=True)
    both = pd.concat([reg[[*analysis.shape_cols(reg), "planner", "regret"]],
                      rep[[*analysis.shape_cols(rep), "planner", "regret"]]], ignore_index=True)
    both["set"] = part if part is not None else np.where(held_out(both), "held-out", "fit")
    both["lengths"] = lengths_of(both)
    rows = []
    for (kernel, part_, lengths, planner), g in both.groupby(["kernel", "set", "lengths", "planner"]):
        r = g["regret"].dropna()
        rows.append(dict(kernel=kernel, set=part_, lengths=lengths, planner=planner, shapes=len(g), measured=len(r),
                         geomean=analysis.geomean(r), p90=float(r.quantile(0.9)) if len(r) else math.nan,
                         worst=float(r.max()) if len(r) else math.nan))
    out = pd.DataFrame(rows, columns=["kernel", "set", "lengths", "planner", "shapes", "measured", "geomean", "p90",
                                      "worst"])
    out = (out.assign(_l=out["lengths"].map(LENGTHS.index))
           .sort_values(["kernel", "set", "_l", "geomean"], ascending=[True, False, True, True])
           .drop(columns="_l").reset_index(drop=True))
    out.attrs["per_shape"] = both  # per (shape, planner) regrets, for goal's head-to-head comparisons
    return out


def goal(table: pd.DataFrame, *, new_name: str = "splitlab", ported_exclude: Sequence[str] = ("splitlab-v0",),
         part: str = "held-out") -> pd.DataFrame:
    """Per kernel and lengths (``uniform`` and ``ragged`` batches apart, as ``shootout`` scores them), on the shapes
    of ``part`` (default the held-out ones): the new rule's geomean and worst, the best other planner's geomean,
    and whether the issue's goal (geomean <= 1.02, worst <= 1.10, lower geomean than every ported planner) and the
    registration bar (lower geomean than the old rule and every ported planner) are met.

    "Lower" is head to head where ``table`` came from ``shootout`` (its per-shape regrets in ``attrs``): the new
    rule's geomean over the shapes the other planner has a measured choice on, against the other's (a planner
    that plans only some shapes, e.g. FlashMLA's, is compared on those; one with no measured choice there is not
    compared). ``h2h`` names each comparison. A table
    without a ``lengths`` column is of uniform batches."""
    per_shape = table.attrs.get("per_shape")
    if per_shape is not None and "lengths" not in per_shape:
        per_shape = per_shape.assign(lengths=lengths_of(per_shape))
    mine = table[table["set"] == part]
    if "lengths" not in mine:
        mine = mine.assign(lengths=lengths_of(mine))
    rows = []
    for (kernel, lengths), g in sorted(mine.groupby(["kernel", "lengths"]),
                                       key=lambda kg: (kg[0][0], LENGTHS.index(kg[0][1]))):
        new = g[g["planner"] == new_name].iloc[0]
        others = g[g["planner"] != new_name]
        ported = others[~others["planner"].isin(ported_exclude)]
        best_ported = ported.loc[ported["geomean"].idxmin()]
        if per_shape is not None:  # shapes x planners
            x = per_shape[(per_shape["kernel"] == kernel) & (per_shape["set"] == part)
                          & (per_shape["lengths"] == lengths)]
            x = x.pivot_table(index=analysis.shape_cols(x), columns="planner", values="regret")
        wins, h2h = {}, []
        for name, gm in zip(others["planner"], others["geomean"], strict=True):
            mine = new["geomean"]
            if per_shape is not None:
                both = x[[new_name, name]].dropna() if {new_name, name} <= set(x.columns) else x.iloc[:0]
                measured = [len(x[n].dropna()) if n in x.columns else 0 for n in (name, new_name)]
                if not measured[0]:  # no measured choice of this planner here: nothing to compare
                    continue
                if len(both) < max(measured):
                    mine, gm = analysis.geomean(both[new_name]), analysis.geomean(both[name])
                    h2h.append(f"{name} {gm:.3f} vs {mine:.3f} on {len(both)}")
            wins[name] = bool(mine < gm)
        rows.append(dict(kernel=kernel, lengths=lengths, geomean=new["geomean"], worst=new["worst"],
                         unmeasured=int(new["shapes"] - new["measured"]),
                         best_ported=f"{best_ported['planner']} {best_ported['geomean']:.3f}",
                         beats_ported=all(wins.get(n, True) for n in ported["planner"]),
                         beats_all=all(wins.values()),
                         goal_met=bool(new["geomean"] <= 1.02 and new["worst"] <= 1.10
                                       and all(wins.get(n, True) for n in ported["planner"])),
                         h2h="; ".join(h2h)))
    return pd.DataFrame(rows, columns=["kernel", "lengths", "geomean", "worst", "unmeasured", "best_ported",
                                       "beats_ported", "beats_all", "goal_met", "h2h"])
