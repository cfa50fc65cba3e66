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
# # Kernels beside their peers: roofline fraction per implementation per shape
#
# splitlab's GQA and MLA decode kernels against the kernels teams ship, on the same shapes, measured in the same
# device call: FlashInfer's paged decode (its own plan and its best split), PyTorch SDPA (cuDNN, flash),
# FlashMLA's dense decode and FlashInfer's MLA (`fa3`, `fa2`). Each card's `peers` grid is one sweep; the table
# helpers are `splitlab.peer_table`. The **roofline fraction** is the floor `max(unique bytes / read
# ceiling, FLOPs / matrix ceiling)` of the H200 preset over the measured time (1.0 = at the floor). Then each
# ported planner's regret on FlashInfer's own kernel beside its regret on splitlab's, where FlashInfer's split was
# swept.

# %% tags=["parameters"]
data: str = "h200"  # result set (a catalog name or a folder of sweeps); compared itself when `peers` is empty
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
peers: list = ["h200-peers", "h200-peers-repeat"]  # sweeps of the cards' peers grids: the comparison, then repeats

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import analysis, datasets, notebook, peer_table, plots, results

plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)
compared, repeat = (peers[0], peers[1] if len(peers) > 1 else "") if peers else (data, "")
df, info = datasets.load_data(compared, allow_fake=allow_fake)
display(Markdown(datasets.describe(info, df)))
roles = peer_table.roles(df, allow_fake=allow_fake)
cmp = peer_table.comparison(roles)
if roles.empty:
    display(Markdown("**No splitlab GQA or MLA kernel sweep in these data**: nothing to compare."))

# %% [markdown]
# **Roofline fraction per implementation per shape.** One panel per family; shapes left to right by heads, batch
# and keys. Bandwidth-bound shapes (long contexts, large batches) should sit near 1.0; short contexts at batch 1
# are launch-bound and sit far below it for every implementation.

# %%
fams = list(dict.fromkeys(roles["family"])) if not roles.empty else []
fig, axes = plt.subplots(len(fams) or 1, 1, figsize=(10, 3.6 * max(len(fams), 1)), squeeze=False)
for ax, fam in zip(axes[:, 0], fams or [None], strict=True):
    if fam is None:
        ax.text(0.5, 0.5, "no kernel comparison in these data", ha="center", va="center")
        ax.set_axis_off()
        continue
    g = roles[roles["family"] == fam]
    shapes = g[peer_table.SHAPE].drop_duplicates().sort_values(["num_q_heads", "batch", "ctx_len"])
    shapes = shapes.reset_index(drop=True)
    x = {tuple(r): i for i, r in enumerate(shapes.itertuples(index=False))}
    looks = plots.series_styles(g["role"].unique())
    for role, h in g.groupby("role", sort=False):
        xs = [x[tuple(r)] for r in h[peer_table.SHAPE].itertuples(index=False)]
        order = np.argsort(xs)
        # markers only: neighbouring shapes are categories, and a line between them would read as a trend
        ax.plot(np.asarray(xs)[order], h["roofline"].to_numpy()[order], ms=5, ls="none", alpha=0.9, label=role,
                **looks[role])
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([peer_table.shape_label(r) for _, r in shapes.iterrows()], rotation=70,
                       fontsize=plots.MIN_FONT_PT)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("roofline fraction")
    plots.title(ax, f"{fam.upper()}: floor / measured time", info)
    plots.legend_outside(ax)
notebook.show_figure(fig, "roofline", roles)

# %% [markdown]
# **splitlab against the best peer.** Per shape: the best peer's time over splitlab's (above 1: splitlab is
# faster), at splitlab's planner's default and at its best swept split.

# %%
summ = peer_table.summary(cmp) if not cmp.empty else pd.DataFrame()
if not summ.empty:
    notebook.show_table(summ.rename(columns={
        "geomean_planner": "geomean: planner's default", "geomean_best": "geomean: best split",
        "wins_planner": "faster on", "worst": "worst", "worst_shape": "worst shape", "worst_peer": "against"}))
    fams_ = list(dict.fromkeys(cmp["family"]))
    fig, axes = plt.subplots(len(fams_), 1, figsize=(10, 2.9 * len(fams_)), squeeze=False)
    for ax, (fam, g) in zip(axes[:, 0], cmp.groupby("family", sort=False), strict=True):
        x = np.arange(len(g))
        for col, label, look in (("speedup_planner", "at its planner's default", dict(marker="o", color="#0072B2")),
                                 ("speedup_best", "at its best split", dict(marker="o", color="#E69F00", ms=9,
                                                                            markerfacecolor="none"))):
            ax.plot(x, g[col].to_numpy(), ls="none", ms=look.pop("ms", 5), label=label, **look)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x, [peer_table.shape_label(r) for _, r in g.iterrows()], rotation=70,
                      fontsize=plots.MIN_FONT_PT)
        ax.set_xlim(-0.7, len(g) - 0.3)
        ax.set_ylabel("best peer / splitlab")
        plots.title(ax, f"{fam.upper()}: the best peer's time over splitlab's (above 1: splitlab faster)", info)
        plots.legend_outside(ax)
    notebook.show_figure(fig, "speedup", cmp)
    worst = cmp.sort_values("speedup_planner")
    notebook.show_table(
        worst.assign(shape=[peer_table.shape_label(r) for _, r in worst.iterrows()])[
            ["family", "shape", "best_peer", "best_peer_us", "speedup_planner", "speedup_best"]].rename(columns={
                "best_peer": "best peer", "best_peer_us": "best peer (us)",
                "speedup_planner": "best peer / splitlab (planner)",
                "speedup_best": "best peer / splitlab (best split)"}).reset_index(drop=True),
        top=8, figure="speedup", page="kernels",
        note="The shapes where splitlab at its planner's default is furthest behind the best peer.")

# %% [markdown]
# **Every ported planner on FlashInfer's own kernel.** With FlashInfer's split swept (`flashinfer_decode`:
# `num_splits` = its KV chunks per request through `fixed_split_size`), every registered planner's choice was run
# on FlashInfer's kernel as on splitlab's; regret is the choice over the best split of that kernel. FlashInfer's
# own plan is scored the same way.

# %%
reg_rows = []
for kernel in ("flashinfer_decode", "gqa_decode", "mla_decode"):
    d = df[df["kernel"] == kernel]
    if d.empty or not d["planners"].fillna("").ne("").any():
        continue
    s = analysis.summary(analysis.regret(d, allow_fake=allow_fake)).assign(kernel=kernel)
    reg_rows.append(s)
if not roles.empty and {"FlashInfer (own plan)", "FlashInfer (best split)"} <= set(roles["role"]):
    own = roles[roles["role"] == "FlashInfer (own plan)"].set_index(peer_table.SHAPE)["p50_us"]
    best = roles[roles["role"] == "FlashInfer (best split)"].set_index(peer_table.SHAPE)["p50_us"]
    r = (own / best).dropna()
    reg_rows.append(pd.DataFrame([dict(planner="FlashInfer's own plan", shapes=len(r), measured=len(r),
                                       geomean=analysis.geomean(r), p90=float(r.quantile(0.9)), worst=float(r.max()),
                                       kernel="flashinfer_decode")]))
regrets = pd.concat(reg_rows, ignore_index=True) if reg_rows else pd.DataFrame()
if not regrets.empty:
    table = regrets.pivot_table(index="planner", columns="kernel", values="geomean")
    notebook.show_table(regrets[["kernel", "planner", "shapes", "geomean", "p90", "worst", "worst_shape"]].rename(
        columns={"geomean": "geomean regret", "p90": "p90 regret", "worst": "worst regret", "worst_shape": "at"}))
    if "flashinfer_decode" in table.columns and "gqa_decode" in table.columns:
        t = table[["flashinfer_decode", "gqa_decode"]].dropna(subset=["flashinfer_decode"])
        t = t.sort_values("flashinfer_decode", ascending=False)
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        t.plot.barh(ax=ax)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlim(0.95, float(np.nanmax(t.to_numpy())) + 0.05)
        plots.legend_outside(ax)
        ax.set_xlabel("geomean regret (p50 / best split of that kernel)")
        plots.title(ax, "The ported rules on FlashInfer's kernel and on splitlab's (GQA)", info)
        notebook.show_figure(fig, "flashinfer-kernel", t)

# %% [markdown]
# **Run to run.** The same sweeps measured again in a later device call (another H200): each point's p50 over the
# first run's. Differences between implementations smaller than this spread are noise.

# %%
spread = None
rinfo = datasets.data_info(repeat) if repeat else None


def sweeps(i) -> set:
    return {(s["kernel"], s["grid"]) for s in i.sweeps}


if rinfo is not None and sweeps(rinfo) != sweeps(info):
    display(Markdown(f"`{repeat}` holds other sweeps than `{compared}`: no run-to-run comparison."))
elif rinfo is not None:
    other = results.load(*rinfo.sources)
    j = df[df["status"] == "ok"][["point_id", "kernel", "p50_us"]].merge(
        other[other["status"] == "ok"][["point_id", "p50_us"]], on="point_id", suffixes=("", "_repeat"))
    j["ratio"] = j["p50_us_repeat"] / j["p50_us"]
    if not j.empty:
        spread = (float(j["ratio"].quantile(0.05)), float(j["ratio"].quantile(0.95)), len(j))
        notebook.show_table(j.groupby("kernel")["ratio"].describe(percentiles=[0.05, 0.5, 0.95])
                            .rename(columns={"count": "points"}))
else:
    display(Markdown("No repeat run given (or found): the run-to-run spread is not shown."))

# %%
parts = []
for _, s in summ.iterrows():
    parts.append(f"{s['family'].upper()}: splitlab at its planner's default is {s['geomean_planner']:.3f}x the best "
                 f"peer (geomean over {s['shapes']} shapes; at its best split {s['geomean_best']:.3f}x), faster on "
                 f"{s['wins_planner']}, worst {s['worst']:.2f}x at {s['worst_shape']} against {s['worst_peer']}")
if not regrets.empty and "FlashInfer's own plan" in set(regrets["planner"]):
    o = regrets[regrets["planner"] == "FlashInfer's own plan"].iloc[0]
    parts.append(f"FlashInfer's own plan on its kernel: geomean regret {o['geomean']:.3f} (worst {o['worst']:.2f}x)")
if spread is not None:
    parts.append(f"run to run {spread[0]:.3f}-{spread[1]:.3f} (5-95%, {spread[2]} points)")
text = "; ".join(parts) if parts else "no splitlab kernel sweep with peers in these data"
notebook.record_finding(("MODELLED: " if info.fake else "") + text + ".",
                        families=len(summ), shapes=int(summ["shapes"].sum()) if not summ.empty else 0)
