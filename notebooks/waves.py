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
# # Wave occupancy and each planner's choice
#
# A split-K decode launch of splitlab's kernel has `CTAs = batch x (kv heads | head tiles) x splits`. On a device
# with `SMs` multiprocessors (one CTA per SM in this model) it runs in `ceil(CTAs / SMs)` waves, and the last
# wave is only partly full unless the CTAs are a multiple of the SMs. What that costs is the share of the issued
# wave slots that do work, `waves / ceil(waves)` (the launch's *slot use*): a half-full last wave wastes half the
# time of a 1-wave launch but 2% of a 31-wave one. The heatmaps show, for one workload family, the **slot use**
# (color) and the **waves** (number in the cell) over batch and split count, on each device; each planner's
# choice at the chosen context is drawn on top. Nothing here is measured: the wave
# model and the planners are pure functions (`splitlab plan` prints the same numbers). Where the data hold the
# same family on the same device, the measured best split (the oracle) is drawn as a black cross.

# %% tags=["parameters"]
data: str = "h200"  # result set for the optional oracle overlay (a catalog name or a folder of sweeps)
allow_fake: bool = False  # accept modelled rows (the fake timer) for the overlay; figures then say MODELLED
workload: str = "deepseek-v3-mla"  # model preset: splitlab.workloads.names()
num_q_heads: int = 0  # 0 keeps the preset's query heads; e.g. 64 for seed 000's Phase 0
ctx_len: int = 65536  # context (keys per request) at which the planners' choices are drawn
devices: list = ["h200", "mi355x", "rtx5090"]  # device presets: splitlab.devices.names()
batches: list = [1, 2, 4, 8, 16, 32, 64, 128]  # batch axis of the heatmaps (powers of two)
max_splits: int = 256  # split axis: powers of two up to this

# %%
import re
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import analysis, datasets, notebook, planners, plots, waves, workloads
from splitlab import devices as devmod
from splitlab.cli import plan_rows
from splitlab.errors import SplitlabError

plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)

base = workloads.get(workload, batch=1, ctx_len=ctx_len)
if num_q_heads:
    base = base.with_(num_q_heads=int(num_q_heads))
devs = [devmod.get(d) for d in devices]
splits_axis = [1 << i for i in range(int(np.log2(max_splits)) + 1)]
names = [n for n in planners.names(base.kind)]
family = (f"{workload}" + (f" with {base.num_q_heads} heads" if num_q_heads else "")
          + f" ({base.kind}, {base.num_q_heads}/{base.num_kv_heads} heads, D {base.head_dim_qk}/{base.head_dim_v})")
display(Markdown(f"**Workload family:** {family}; planners' choices at context **{plots.fmt_pow2(ctx_len)}**. "
                 f"**Devices:** " + ", ".join(f"{d.name} ({d.sm_count} SMs)" for d in devs) + "."))

# %% [markdown]
# The optional overlay: the data's measured best split for this family, where the data have it.

# %%
oracle_pts = pd.DataFrame(columns=["device", "batch", "num_splits", "p50_us"])
info = None
try:
    df, info = datasets.load_data(data, allow_fake=allow_fake)
    best = analysis.oracle(df, allow_fake=allow_fake)
    fam = best[(best["kind"] == base.kind) & (best["num_q_heads"] == base.num_q_heads)
               & (best["num_kv_heads"] == base.num_kv_heads) & (best["head_dim_qk"] == base.head_dim_qk)
               & (best["ctx_len"] == ctx_len) & best["kernel"].str.endswith("_decode")]
    oracle_pts = fam[["device", "batch", "num_splits", "p50_us"]].dropna()
    msg = (f"The data ({info.label}) hold {len(oracle_pts)} measured optima of this family at context "
           f"{plots.fmt_pow2(ctx_len)}." if len(oracle_pts) else
           f"The data ({info.label}) hold no shape of this family at context {plots.fmt_pow2(ctx_len)}: no overlay.")
except SplitlabError as e:
    msg = f"No overlay: {e}"
display(Markdown(msg))

# %%
rows = []
for dev in devs:
    for b in batches:
        w = base.with_(batch=int(b))
        for s in splits_axis:
            st = waves.wave_stats(w, s, dev.sm_count)
            rows.append(dict(device=dev.name, sms=dev.sm_count, batch=b, splits=s, ctas=st.ctas, waves=st.waves,
                             num_waves=st.num_waves, fill=st.last_wave_fill, efficiency=st.efficiency))
grid = pd.DataFrame(rows)
ws_ = [base.with_(batch=int(b)) for b in batches]
choices = pd.DataFrame(plan_rows(ws_, devs, names)).dropna(subset=["num_splits"])
choices["slot_use"] = choices["waves"] / np.ceil(choices["waves"])
# A release of a rule that plans as the rule on every batch and device here (flashinfer-0.7.4 as flashinfer, on
# dies of 64 SMs or more) is drawn once, labelled with both names.
plan_cols = [c for c in ("num_splits", "block_n", "block_k", "block_h") if c in choices.columns]
labels = {n: n for n in choices["planner"].unique()}
for twin, base_name in analysis.planner_versions(choices["planner"].unique()).items():
    a = choices[choices["planner"] == base_name].set_index(["device", "batch"])[plan_cols]
    b = choices[choices["planner"] == twin].set_index(["device", "batch"])[plan_cols]
    if a.index.equals(b.index) and a.astype(str).equals(b.astype(str)):
        choices = choices[choices["planner"] != twin]
        labels[base_name] = f"{base_name} = {twin}"
        display(Markdown(f"`{twin}` plans as `{base_name}` on every batch and device here: drawn once, as "
                         f"`{labels[base_name]}`."))

# %% [markdown]
# ## Slot use over batch and splits
#
# Color: the share of the issued wave slots that do work, `waves / ceil(waves)` (1 = whole waves; many waves are
# near 1 whatever the last one holds). Number: waves, `CTAs / SMs`. Markers: each planner's split count for that
# batch (slightly offset per planner so that equal choices stay visible).

# %%
for dev in devs:
    g = grid[grid["device"] == dev.name]
    use = g.pivot(index="batch", columns="splits", values="efficiency")
    nw = g.pivot(index="batch", columns="splits", values="waves")
    fig, ax = plt.subplots(figsize=plots.figsize(10.0, 5.4))
    hm = plots.log2_heatmap(ax, use, cmap=plots.FILL_CMAP, vmin=0, vmax=1, annot=nw, fmt="{:.3g}",
                            cbar_label="slot use: waves / ceil(waves)", xlabel="splits (log2)", ylabel="batch (log2)",
                            text_dy=0.27)
    ch = choices[choices["device"] == dev.name]
    order = plots.planner_order(ch["planner"])
    for k, name in enumerate(order):
        c = ch[ch["planner"] == name]
        off = -0.38 + 0.5 * k / max(1, len(order) - 1)  # the lower part of the cell; the number sits above
        st = plots.planner_style(name)
        ax.scatter(hm.x(c["num_splits"]), hm.y(c["batch"]) + off, s=34,
                   color=st["color"], marker=st["marker"], edgecolor="black", linewidth=0.4, label=labels[name],
                   zorder=3)
    o = oracle_pts[oracle_pts["device"] == dev.name]
    if len(o):
        ax.scatter(hm.x(o["num_splits"]), hm.y(o["batch"]), s=70, marker="x",
                   color=plots.ORACLE_COLOR, linewidth=1.6, label="measured best", zorder=4)
    plots.legend_outside(ax)
    plots.title(fig, f"{family}: slot use (color), waves (number), planners at {plots.fmt_pow2(ctx_len)}",
                info if len(o) else None, device=f"{dev.name}, {dev.sm_count} SMs")
    notebook.show_figure(fig, "fill-" + re.sub(r"[^a-z0-9]+", "-", dev.name.lower()), g.reset_index(drop=True))

# %% [markdown]
# ## The CTAs each planner launches
#
# CTAs of splitlab's kernel at each planner's choice against batch, with the SM count and its multiples marked:
# a point just above a line starts a wave that is nearly empty.

# %%
fig, axes = plt.subplots(1, len(devs), figsize=plots.figsize(3.6 * len(devs) + 1.4, 4.0), sharey=True,
                         squeeze=False)
for ax, dev in zip(axes[0], devs, strict=True):
    ch = choices[choices["device"] == dev.name]
    for name in plots.planner_order(ch["planner"]):
        c = ch[ch["planner"] == name].sort_values("batch")
        ax.plot(c["batch"], c["ctas"], ms=4, lw=1.1, **(plots.planner_style(name) | {"label": labels[name]}))
    plots.log2_axis(ax, "both")
    ax.set_xlabel("batch (log2)")
    ax.set_ylim(0.7, max(choices["ctas"].max() * 1.5, dev.sm_count * 2))
    plots.mark_sm_multiples(ax, dev.sm_count, axis="y")
    ax.set_title(f"{dev.name} ({dev.sm_count} SMs)")
axes[0][0].set_ylabel("CTAs at the planner's choice (log2)")
plots.legend_outside(axes[0][-1])
plots.title(fig, f"{family} at {plots.fmt_pow2(ctx_len)}: CTAs of each planner's choice", None,
            device=", ".join(d.name for d in devs))
notebook.show_figure(fig, "ctas", choices.reset_index(drop=True))

# %% [markdown]
# ## The choices as a table
#
# `splits (slot use)` per batch and planner.

# %%
for dev in devs:
    ch = choices[choices["device"] == dev.name].copy()
    ch["cell"] = [f"{int(s)} ({f:.0%})" for s, f in zip(ch["num_splits"], ch["slot_use"], strict=True)]
    t = ch.pivot(index="batch", columns="planner", values="cell")[plots.planner_order(ch["planner"])]
    display(Markdown(f"**{dev.name}** ({dev.sm_count} SMs)"))
    notebook.show_table(t.rename(columns=labels))

# %%
eff = choices.assign(eff=choices["waves"] / np.ceil(choices["waves"]), nw=np.ceil(choices["waves"]))
first = eff[eff["device"] == devs[0].name].groupby("planner").agg(eff=("eff", "mean"), nw=("nw", "max"))
first = first.sort_values("eff")
lo_p, hi_p = first.index[0], first.index[-1]
text = (f"{family} at {plots.fmt_pow2(ctx_len)} on {devs[0].name} (modelled waves): {lo_p}'s choices use "
        f"{first.loc[lo_p, 'eff']:.0%} of the issued wave slots on average, {hi_p}'s {first.loc[hi_p, 'eff']:.0%} "
        f"(over up to {int(first.loc[hi_p, 'nw'])} waves)")
o = oracle_pts[oracle_pts["device"] == devs[0].name]
if len(o):
    st_o = [waves.wave_stats(base.with_(batch=int(b)), int(s), devs[0].sm_count)
            for b, s in zip(o["batch"], o["num_splits"], strict=True)]
    ch0 = choices[choices["device"] == devs[0].name].merge(o[["batch", "num_splits"]], on="batch",
                                                         suffixes=("", "_best"))
    hits = (ch0["num_splits"] == ch0["num_splits_best"]).groupby(ch0["planner"]).sum().sort_values()
    src = info.device + (", MODELLED" if info.fake else "")
    text += (f"; the measured best splits ({len(o)} batches, {src}) run {np.mean([x.waves for x in st_o]):.2g} "
             f"waves on average at {np.mean([x.efficiency for x in st_o]):.0%} of their slots, and "
             f"{hits.index[-1]} picks the measured best split on {int(hits.iloc[-1])} of {len(o)}")
notebook.record_finding(text + ".", device=devs[0].name,
                        mean_wave_efficiency={k: round(float(v), 3) for k, v in first["eff"].items()})
