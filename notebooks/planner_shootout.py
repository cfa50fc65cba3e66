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
# measured points (the sweeps' own `splitlab` tags are the rule of the day each was made).

# %% tags=["parameters"]
data: str = "h200"  # result set: a catalog name (data/catalog.toml) or a folder of sweeps; h200: the current set
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
kernels: list = []  # kernels to compare; empty means every kernel whose points carry planner choices
include_foreign: bool = False  # also the name@device choices (a rule as it plans for another device)
worst_n: int = 3  # shapes listed per planner where it loses most
confirm: list = ["h200-confirm"]  # sets of shapes in no fit and no held-out set (catalog names or folders)

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

# splitlab's own rule changed while the shipped sweeps were made (first rule, then fitted), so its tags in the data
# mix versions: the registered rule is scored by replaying it on the measured points instead.
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
# or 32, context 4K or 64K, and one or two head counts per family; `splitlab.fit.held_out`). The ported planners are
# scored from the data's own choices; the fitted rule (the registered `splitlab`) and the first, unfitted rule
# (`splitlab-v0`) by `analysis.replay` (the measured point at exactly its plan).
# The goal: held-out geomean <= 1.02 and worst <= 1.10 per kernel, below every ported planner.

# %%
from splitlab import fit  # noqa: E402

fit_table = fit.shootout(df, allow_fake=allow_fake) if len(reg) else pd.DataFrame()
if len(fit_table):
    display(fit_table.round(3))
    display(Markdown("**Goal on the held-out shapes** (`splitlab` = the fitted rule):"))
    display(fit.goal(fit_table).round(3))
else:
    display(Markdown("No shape of splitlab's kernels with planner choices in these data: nothing to fit."))

# %% [markdown]
# ## Confirmation: fresh sweeps of shapes in no fit and no held-out set
#
# Each `confirm` set (by default the catalog's, `data/catalog.toml`: shapes chosen and swept after the rule was
# final, every power-of-two and wave-filling split, on the same kernel version as the data) is scored as above;
# `splitlab` is the fitted rule, replayed. The goal table compares it with a planner that plans only some shapes
# (FlashMLA's) on those shapes (`h2h`). The catalog's archive sets (older kernel versions and rules) load the same
# way, by name.

# %%
for path in confirm if len(fit_table) else []:
    cdf, cinfo = report.load_data(path, allow_fake=allow_fake)
    name = cinfo.name
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
