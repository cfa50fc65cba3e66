# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Planner shootout: every planner's regret on one result set
#
# The sweep measures every registered planner's choice for every shape. A planner's **regret** on a shape is the
# p50 of its choice over the best p50 measured for that shape (1.0 = it picked the optimum). Below: each
# planner's regret distribution per kernel (empirical CDFs: the further left and the steeper, the better), a
# table of geomean, p90 and worst regret, and the shapes where each planner loses most. Planners only cover the
# kinds they were written for (FlashMLA has no GQA rule, aiter only sparse MLA), so compare planners within a
# kernel; the overall row mixes different shape sets. `splitlab` is the registered (fitted) rule, replayed on the
# measured points (its choices were not all tagged by the sweeps: the rule changed between their sessions).

# %% tags=["parameters"]
data: str = "data/h200"  # result set: a sweep folder or a folder of sweeps (the shipped H200 data by default)
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
kernels: list = []  # kernels to compare; empty means every kernel whose points carry planner choices
include_foreign: bool = False  # also the name@device choices (a rule as it plans for another device)
worst_n: int = 3  # shapes listed per planner where it loses most
confirm: list = [f"data/h200-confirm{n}" for n in ("", 2, 3, 4, 5, 6, 7)]  # sweeps of shapes in no fit
newer: list = []  # re-sweeps on a later kernel version: the fit's tables take them over data's rows of their kernels

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Markdown, display

from splitlab import analysis, plots, report

plots.setup()
warnings.filterwarnings("ignore", category=UserWarning)
df, info = report.load_data(data, allow_fake=allow_fake)
display(Markdown(report.describe(info, df)))

# splitlab's own rule changed between the sessions of the shipped sweeps (first rule, then fitted), so its tags
# in the data mix versions: the registered rule is scored by replaying it on the measured points instead.
reg = analysis.regret(df, allow_fake=allow_fake, replayed=("splitlab",))
if not include_foreign:
    reg = reg[~reg["planner"].str.contains("@", regex=False)]
if kernels:
    reg = reg[reg["kernel"].isin(kernels)]
todo = sorted(reg["kernel"].unique())
reg["shape"] = [f"{r.kind} H{r.num_q_heads}/{r.num_kv_heads} B{r.batch} N{plots.fmt_pow2(r.ctx_len)}"
                + (f" top-k {r.topk}" if r.topk else "") for r in reg.itertuples()]
unmeasured = reg[reg["regret"].isna()]
display(Markdown(f"{reg[['kernel', 'shape']].drop_duplicates().shape[0]} shapes over {len(todo)} kernel(s), "
                 f"{reg['planner'].nunique()} planners; {len(unmeasured)} choices were not measured correctly "
                 "(wrong or error) and count as no regret below."))

# %% [markdown]
# ## Regret distributions

# %%
if todo:
    ncol = min(3, len(todo))
    nrow = int(np.ceil(len(todo) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=plots.figsize(4.4 * ncol + 1.2, 3.8 * nrow), squeeze=False)
    for ax, kernel in zip(axes.flat, todo, strict=False):
        g = reg[reg["kernel"] == kernel]
        plots.ecdf(ax, {p: g.loc[g["planner"] == p, "regret"] for p in g["planner"].unique()})
        ax.set_title(kernel)
        ax.legend(loc="lower right", frameon=True)
    for ax in list(axes.flat)[len(todo):]:
        ax.axis("off")
    plots.title(fig, "Regret of each planner's choice against the measured best (ECDF)", info)
    plt.show()

# %%
if len(reg.dropna(subset=["regret"])):
    r = reg.dropna(subset=["regret"])
    order = plots.planner_order(r["planner"])
    fig, ax = plt.subplots(figsize=plots.figsize(max(6.0, 1.0 * len(todo) * len(order) / 2.5), 3.8))
    sns.boxplot(data=r, x="kernel", y="regret", hue="planner", hue_order=order, order=todo, ax=ax,
                palette=plots.planner_palette(order), fliersize=2, linewidth=0.8)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("regret (p50 / best p50)")
    ax.set_xlabel("")
    plots.legend_outside(ax)
    plots.title(fig, "Regret by kernel and planner", info)
    plt.show()

# %% [markdown]
# ## Geomean, p90 and worst regret

# %%
tables = []
for kernel in todo:
    s = analysis.summary(reg[reg["kernel"] == kernel])
    s.insert(0, "kernel", kernel)
    tables.append(s)
per_kernel = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
if len(per_kernel):
    display(per_kernel.round(3))
    fig, ax = plt.subplots(figsize=plots.figsize(8.5, 0.6 * max(3, len(todo)) + 1.4))
    t = per_kernel.pivot(index="kernel", columns="planner", values="geomean")
    t = t[plots.planner_order(t.columns)]
    plots.heatmap(ax, t, annot=t, fmt="{:.2f}", cmap=plots.REGRET_CMAP, log_color=True, vmin=1.0, ratio_ticks=True,
                  cbar_label="geomean regret")
    ax.set_xlabel("")
    ax.set_ylabel("")
    plots.title(fig, "Geomean regret per kernel (hatched: the planner does not cover the kind)", info)
    plt.show()
    overall = analysis.summary(reg)
    display(Markdown("**All kernels together** (different planners cover different shapes):"))
    display(overall.round(3))

# %% [markdown]
# ## Where each planner loses most

# %%
lost = (reg.dropna(subset=["regret"]).sort_values("regret", ascending=False)
        .groupby("planner", group_keys=False).head(worst_n))
lost = lost[["planner", "kernel", "shape", "num_splits", "oracle_splits", "p50_us", "oracle_us", "regret"]]
lost = lost.assign(_o=lost["planner"].map({p: i for i, p in enumerate(plots.planner_order(lost["planner"]))}))
display(lost.sort_values(["_o", "regret"], ascending=[True, False]).drop(columns="_o").round(3).reset_index(drop=True))
if len(unmeasured):
    display(Markdown("**Choices not measured correctly:**"))
    display(unmeasured.groupby(["planner", "kernel", "status"]).size().rename("choices").reset_index())

# %% [markdown]
# ## splitlab's planner, fitted: held-out shapes against every ported rule
#
# `splitlab.fit` fits the few constants of splitlab's wave-cost rule on the *fit* shapes only (held out: batch 2
# or 32, context 4K or 64K, and one or two head counts per family; `splitlab.fit.held_out`). With `newer` (the
# report passes the sixth kernel version's re-sweeps of every family's fit grids, `data/h200-kernel-v6-fit`, and
# of 64/128-head sparse and MLA shapes), those take the place of `data`'s rows of the kernels they hold, as in the
# fit. The ported planners are scored from the data's own choices; the fitted rule (the registered `splitlab`) and
# the first, unfitted rule (`splitlab-v0`) by `analysis.replay` (the measured point at exactly its plan).
# The goal: held-out geomean <= 1.02 and worst <= 1.10 per kernel, below every ported planner.

# %%
from splitlab import fit, results  # noqa: E402

fit_df = df
if newer:
    later = report.one_per_point(results.load(*newer))
    fit_df = fit.layered(df, later)
    display(Markdown(f"The fit's tables: {', '.join(sorted(set(later['kernel'])))} from "
                     f"{', '.join(f'`{p}`' for p in newer)}; the other kernels from `{data}`."))
fit_table = fit.shootout(fit_df, allow_fake=allow_fake) if len(reg) else pd.DataFrame()
if len(fit_table):
    display(fit_table.round(3))
    display(Markdown("**Goal on the held-out shapes** (`splitlab` = the fitted rule):"))
    display(fit.goal(fit_table).round(3))
else:
    display(Markdown("No shape of splitlab's kernels with planner choices in these data: nothing to fit."))

# %% [markdown]
# ## Confirmation: a fresh sweep of shapes in no fit and no held-out set
#
# The `confirm` grids of the three splitlab cards (batches 3-192, contexts 8K/32K/96K, head counts and top-k the
# fit never saw; every power-of-two and wave-filling split), swept after the fit; then `confirm2` (batches 5-80,
# contexts 12K/48K, top-k 1536), swept after the rule was revised on what `confirm` showed; then `confirm3` (GQA
# only: batches 7-96, contexts 6K/24K), swept after the GQA rule gained its partial-wave cost (`tail`); then
# `confirm4` (sparse MLA only: 32-128 heads at BLOCK_H 16/32/64, 7-160 tokens, top-k 768/2048), swept before
# the sparse rule picked its head tile; then `confirm5` (sparse MLA: 32-128 heads, 10/36/120 tokens, top-k
# 1280), swept after it; then `confirm6` (GQA: batches 9-72, contexts 2.5K/20K/56K), swept after the GQA rule
# gained its sub-wave floor (`lone`; on the third kernel version, whose combine is 0.985x the second's time on
# average); then `confirm7` (sparse MLA: 24/32/96/128 heads, top-k 640/1792/2048), swept after the 32-row head
# tile took the wide tile's wave width. MLA and sparse MLA's confirm sweeps were re-measured on the second kernel
# version (BENCHMARKS.md). The fourth kernel version (the 64-row MLA tile in Gluon, faster on the H200) has
# `h200-kernel-v4` (the confirm grids' 64/128-head shapes, re-swept on it) and `confirm8` (sparse MLA: 64/128
# heads, 2-40 tokens, top-k 1024, both head tiles), swept before the 16-row tile's worth was refitted on it. The
# fifth (a faster merge) has `h200-kernel-v5` (the same shapes again), `h200-kernel-v5-fit` (sparse MLA's fit
# grids again) and two fresh sparse sets, `confirm9` (top-k 896/1664) and `confirm10` (top-k 1152/1920), both
# head tiles at every split; the rule's constants did not change with it. The sixth (the Gluon tile's split
# launches write bf16 partials) has `h200-kernel-v6` (the 64/128-head shapes again) and sparse MLA's BLOCK_H 16
# against 64 at every split, which the refit on the sixth version then read as fit data (with `h200-kernel-v6-fit`,
# every family's fit grids re-swept, and `h200-kernel-v6-fit2`, MLA's 16/32-row tiles at batches 5-40); sparse
# MLA's fit data were re-timed in session 11 over input sets rotated by the rows a call reads
# (`h200-kernel-v6-sparse`; `h200-kernel-v6-sparse-pool3` is the same grids over three copies of the token pool,
# the rotation of every earlier sparse sweep, which left 1-32-token points L2-warm and shared one graph launch
# among three calls). Its fresh sets are `confirm11` (batches 13-80, contexts
# 3K/10K/40K, top-k 384/1408; swept before the refit, read after it, and before the split candidates gained one
# key tile a split), `confirm12` (contexts 1.5K/5K/28K, top-k 320/704/1216; swept after that), `confirm13` (sparse
# MLA only, 32-128 heads, top-k 448/960/1600; swept after the first sparse refit with 32 heads among the fit shapes
# and the Gluon tile's own key-tile cost), `confirm14` (sparse MLA only, 16-128 heads, top-k 576/832/1344; swept
# after the second, which held the merge costs physical and weighs BLOCK_K 32 at 16 heads) and `confirm15` (GQA at
# batches 17-60 and 14K/36K keys, MLA-16/32 at batches 1-44 and 6K-56K keys, sparse MLA at 1-21 tokens and top-k
# 736/1472; swept after the rule priced a split's partial writes per CTA on the busiest SM: the clean set of the
# final rule), swept again as `confirm15-repeat` (run-to-run) and, sparse MLA only, over the new rotation as
# `confirm15-sparse`. `h200-check` is no confirm set: it sweeps whole the shapes whose picks by the rule of session
# 10 no earlier sweep timed (16 heads at top-k 1024, BLOCK_K 32), so they can be scored in one session. The older
# sets are of older kernels: the rule now prices the sixth version's bf16 partials, so its scores there are not what
# it was fitted for.
# Every rule is scored as above; `splitlab` is the fitted rule, replayed. The goal table compares it with a
# planner that plans only some shapes (FlashMLA's) on those shapes (`h2h`).

# %%
for path in confirm if len(fit_table) else []:
    cdf, cinfo = report.load_data(path, allow_fake=allow_fake)
    name = cinfo.path.name
    display(Markdown(f"### {name}\n\n" + report.describe(cinfo, cdf)))
    confirm_table = fit.shootout(cdf, allow_fake=allow_fake, part=name)
    display(confirm_table.round(3))
    display(Markdown(f"**Goal on the {name} shapes:**"))
    display(fit.goal(confirm_table, part=name).round(3))
if not confirm:
    display(Markdown("No confirm sweep given (`confirm` parameter)."))

# %%
if len(per_kernel):
    wins = per_kernel.loc[per_kernel.groupby("kernel")["geomean"].idxmin()]
    losses = per_kernel.loc[per_kernel.groupby("kernel")["geomean"].idxmax()]
    parts = [f"{w.kernel}: {w.planner} {w.geomean:.2f}x (worst {l.planner} {l.geomean:.2f}x, up to {l.worst:.2f}x)"
             for w, l in zip(wins.itertuples(), losses.itertuples(), strict=True)]
    text = "lowest geomean regret per kernel: " + "; ".join(parts)
else:
    text = "no planner choice was measured"
report.record_finding(("MODELLED: " if info.fake else "") + text + f" ({info.device}, {info.date}).",
                      geomean={f"{r.kernel}/{r.planner}": round(float(r.geomean), 4)
                               for r in per_kernel.itertuples()} if len(per_kernel) else {})
