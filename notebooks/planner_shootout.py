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
# # Planner shootout: every planner's regret, on every result set
#
# A planner's **regret** on a shape is the p50 of its choice over the best p50 measured for that shape (1.0 = it
# picked the optimum). First the answer across result sets: the current set's *fit* shapes (the only ones
# `splitlab.fit` fits the rule's constants on), its *held-out* shapes (batch 2 or 32, context 4K or 64K, one or two
# head counts per family: `splitlab.scoring.held_out`) and each *confirm* set (shapes swept after the rule was final).
# Batches whose requests all have the longest length (*uniform*) and batches of mixed lengths (*ragged*: a
# `length_dist` other than `uniform`) are scored apart in every set, figure and table, so that neither hides the
# other. Then the regret distributions on the current set; the tables behind them are folded at the end (click a
# line to open it). Planners cover only the kinds they were written for (FlashMLA has no GQA rule, aiter only
# sparse MLA), so compare planners within a family. `splitlab` is the registered (fitted) rule and `splitlab-v0` the
# first, unfitted one, both replayed on the measured points (the sweeps' own `splitlab` tags are the rule of the day
# each was made). The goal: held-out geomean <= 1.02 and worst <= 1.10 per family, uniform and ragged batches each,
# below every ported rule.

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
from IPython.display import HTML, Markdown, display

from splitlab import analysis, datasets, headline, notebook, plots, scoring

plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)
df, info = datasets.load_data(data, allow_fake=allow_fake)
display(Markdown(datasets.describe(info, df)))

# splitlab's own rule changed while the shipped sweeps were made (first rule, then fitted), so its tags in the data
# mix versions: the registered rule is scored by replaying it on the measured points instead.
reg = analysis.regret(df, allow_fake=allow_fake, replayed=("splitlab",))
if not include_foreign:
    reg = reg[~reg["planner"].str.contains("@", regex=False)]
if kernels:
    reg = reg[reg["kernel"].isin(kernels)]
reg["lengths"] = scoring.lengths_of(reg)
# (kernel, lengths) pairs: each kernel's uniform batches, then its ragged ones where the data hold any
todo = sorted(set(zip(reg["kernel"], reg["lengths"], strict=True)),
              key=lambda kn: (kn[0], scoring.LENGTHS.index(kn[1])))
ragged = any(n == headline.RAGGED for _, n in todo)
reg["shape"] = [f"{r.kind} H{r.num_q_heads}/{r.num_kv_heads} B{r.batch} N{plots.fmt_pow2(r.ctx_len)}"
                + (f" top-k {r.topk}" if r.topk else "")
                + (f" {r.length_dist} seed {r.length_seed}" if r.lengths == headline.RAGGED else "")
                for r in reg.itertuples()]
unmeasured = reg[reg["regret"].isna()]
n_ragged = reg.loc[reg["lengths"] == headline.RAGGED, ["kernel", "shape"]].drop_duplicates().shape[0]
display(Markdown(f"{reg[['kernel', 'shape']].drop_duplicates().shape[0]} shapes ({n_ragged} of them ragged "
                 f"batches) over {reg['kernel'].nunique()} kernel(s), {reg['planner'].nunique()} planners; "
                 f"{len(unmeasured)} choices were not measured correctly (wrong or error) and count as no regret "
                 "below."))

# %% [markdown]
# ## Across result sets
#
# Per family, set and lengths (uniform and ragged batches apart, where the data hold ragged ones), each planner's
# geomean regret (colour, upper number) and worst (lower number); hatched: the planner has no measured choice
# there. Below it, splitlab's rule against the best ported rule on the held-out and confirm shapes: the report's
# headline, a row per family and lengths (a planner that plans only some shapes, such as FlashMLA's, is compared on
# its shapes).

# %%
confirm_sets, confirm_info = {}, {}
for path in confirm:
    cdf, cinfo = datasets.load_data(path, allow_fake=allow_fake)
    confirm_sets[cinfo.name], confirm_info[cinfo.name] = cdf, cinfo
shootouts = headline.shootouts(df, confirm_sets, allow_fake=allow_fake) if len(reg) else {}
scores, summary = headline.planner_scores(shootouts) if shootouts else ({}, None)
sets = ["fit", headline.HELD_OUT, *confirm_sets]
across = headline.summary_table(summary, sets) if summary is not None else pd.DataFrame()
# A release of a rule that chose what the rule chose wherever both were recorded (flashinfer-0.7.4, flashinfer on
# dies of 64 SMs or more) is shown once, as the rule; where they differ both are shown, and the note says how often.
twins = analysis.version_twins(pd.concat([df, *confirm_sets.values()], ignore_index=True))
merged = analysis.merged_versions(twins)
reg = reg[~reg["planner"].isin(list(merged))]
differ = {k: v for k, v in twins.items() if k not in merged}  # the merged ones say so under the figure
if differ:
    display(Markdown(analysis.twins_note(differ)))
if len(across):
    fig = headline.figure(across, info, fig=plt.figure(), title="Each planner's regret per family and set"
                          + (" and lengths" if ragged else "") + ": geomean (colour, upper number), worst (lower)",
                          merged=merged)
    across = across[~across["planner"].isin(list(merged))]
    notebook.show_figure(fig, "summary", across)
    if scores:
        head = headline.Headline(data=info.name, sets=[s for s in sets[1:] if (across["set"] == s).any()],
                                 planners=scores, peers={}, peers_set="", summary=summary)
        display(HTML(headline.html(head, kernels=False)))
    else:
        display(Markdown("splitlab's rule has no measured choice in these data (its plans were not swept): no "
                         "headline."))
else:
    display(Markdown("No shape of splitlab's kernels with planner choices in these data: nothing to score."))
if not confirm:
    display(Markdown("No confirm set given (`confirm` parameter)."))

# %% [markdown]
# ## Regret distributions on the current set
#
# Every shape of the data, fit and held-out together, one panel per kernel (and per lengths, uniform and ragged
# batches apart, where the data hold ragged ones): the further left and the steeper a planner's line, the better.
# Each panel's title gives its shapes; under the figure, each planner scored on fewer of them, and why.

# %%
if todo:
    ncol = min(3, len(todo))
    nrow = int(np.ceil(len(todo) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=plots.figsize(3.4 * ncol + 1.6, 3.4 * nrow), squeeze=False)
    for ax, (kernel, lengths) in zip(axes.flat, todo, strict=False):
        g = reg[(reg["kernel"] == kernel) & (reg["lengths"] == lengths)]
        plots.ecdf(ax, {p: g.loc[g["planner"] == p, "regret"] for p in g["planner"].unique()}, counts=False)
        n_shapes = g[analysis.shape_cols(g)].drop_duplicates().shape[0]
        ax.set_title(f"{headline.family_label(kernel, lengths, ragged)}: {n_shapes} shapes")
    for ax in list(axes.flat)[len(todo):]:
        ax.axis("off")
    plots.legend_outside(fig)  # one legend for every panel, beside them (a planner keeps its colour)
    plots.title(fig, "Regret of each planner's choice against the measured best (ECDF)", info)
    notebook.show_figure(fig, "ecdf", reg[["kernel", "lengths", "shape", "planner", "num_splits", "oracle_splits",
                                           "p50_us", "oracle_us", "regret"]].reset_index(drop=True))
    cov = analysis.coverage(reg, df, by=("kernel", "lengths"), allow_fake=allow_fake)
    if len(cov):
        display(Markdown("**Planners scored on fewer shapes than their panel holds:**\n" + "\n".join(
            f"- {headline.family_label(r.kernel, r.lengths, ragged)}: `{r.planner}` on {r.scored} of {r.shapes}: "
            f"{r.why}." for r in cov.itertuples())))

# %% [markdown]
# ## The tables behind the figures

# %%
tables = []
for kernel, lengths in todo:
    s = analysis.summary(reg[(reg["kernel"] == kernel) & (reg["lengths"] == lengths)])
    s.insert(0, "kernel", kernel)
    s.insert(1, "lengths", lengths)
    tables.append(s)
per_kernel = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
if len(per_kernel):
    together = [f"**All kernels together, {n} batches** (different planners cover different shapes):"
                if ragged else "**All kernels together** (different planners cover different shapes):"
                for n in scoring.LENGTHS if (reg["lengths"] == n).any()]
    wholes = [analysis.summary(reg[reg["lengths"] == n]) for n in scoring.LENGTHS if (reg["lengths"] == n).any()]
    notebook.fold(f"Geomean, p90 and worst regret per kernel{', lengths' if ragged else ''} and planner, every shape "
                  f"of {info.name}", per_kernel, *[x for pair in zip(together, wholes, strict=True) for x in pair])
lost = (reg.dropna(subset=["regret"]).sort_values("regret", ascending=False)
        .groupby(["planner", "lengths"], group_keys=False).head(worst_n))
lost = lost[["planner", "kernel", "lengths", "shape", "num_splits", "oracle_splits", "p50_us", "oracle_us", "regret"]]
lost = lost.assign(_o=lost["planner"].map({p: i for i, p in enumerate(plots.planner_order(lost["planner"]))}),
                   _l=lost["lengths"].map(scoring.LENGTHS.index))
notebook.fold(f"Where each planner loses most (its {worst_n} worst shapes{' per lengths' if ragged else ''})",
              lost.sort_values(["_o", "_l", "regret"], ascending=[True, True, False]).drop(columns=["_o", "_l"])
              .reset_index(drop=True))
if len(unmeasured):
    notebook.fold(f"Choices not measured correctly ({len(unmeasured)})",
                  unmeasured.groupby(["planner", "kernel", "status"]).size().rename("choices").reset_index())
for name, table in shootouts.items():
    goal = headline.goal(table, part=name)
    if name == headline.HELD_OUT:
        notebook.fold("splitlab's fitted rule on the fit and held-out shapes against every ported rule, and the goal",
                      table, "**Goal on the held-out shapes** (`splitlab` = the fitted rule; `h2h`: compared on the "
                      "shapes a planner plans, where it plans only some):", goal)
    else:
        notebook.fold(f"Confirm set {name}: its sweeps, every planner, and the goal",
                      datasets.describe(confirm_info[name], confirm_sets[name]), table,
                      f"**Goal on the {name} shapes:**", goal)

# %%
parts = []
for (kernel, lengths), by_set in scores.items():
    fam = headline.family_label(kernel, lengths, any(n == headline.RAGGED for _, n in scores))
    parts.append(f"{fam}: " + ", ".join(f"{s} {p.geomean:.3f} (worst {p.worst:.2f}) against {p.best_cell}"
                                        for s, p in by_set.items()))
text = (("splitlab's rule, geomean regret: " + "; ".join(parts)) if parts else
        "splitlab's rule has no measured choice in these data" if len(reg) else "no planner choice was measured")
notebook.record_finding(("MODELLED: " if info.fake else "") + text + f" ({info.device}, {info.date}).",
                        geomean={f"{r.kernel}/{r.planner}" if r.lengths == headline.UNIFORM else
                                 f"{r.kernel}/{r.lengths}/{r.planner}": round(float(r.geomean), 4)
                                 for r in per_kernel.itertuples()} if len(per_kernel) else {})
