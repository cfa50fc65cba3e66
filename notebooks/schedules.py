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
# # Schedules: how each scheduler deals a ragged batch's keys, and what the GPU says
#
# A split count cuts every request of a batch into the same number of chunks, so a long-tail batch runs as long
# as its longest requests' chunks while most CTAs idle. A *schedule* deals the keys into work items instead
# (`splitlab.planners.schedulers`; `splitlab schedule --json` prints one). Above: one batch's schedule under each
# scheduler, one row per CTA slot, each item a bar over the keys it streams, coloured by request; the title gives
# the time the H200 measured for exactly that schedule (matched by its hash). Below: every batch of the shipped
# study, splitlab's split-count kernel and its work-list kernel at splitlab's schedule against the best peer
# (FlashInfer, FlashMLA) measured in the same run.

# %% tags=["parameters"]
data: str = "h200"  # the report's result set; this page draws the study below whatever the data (its device: H200)
allow_fake: bool = False  # (every row of the study is measured)
study: str = "h200-schedules"  # a catalog bench entry written by experiments/schedules/ragged_ab.py
run: str = "confirm_ab.csv"  # which of its runs: confirm_ab.csv (fresh batches) or ragged_ab.csv
shape: str = "32/8"  # the batch drawn first: its shape (32/8, 64/8, 128/1, mla16, mla128)
batch: int = 64  # its requests (16, 64, 128)
longest: int = 32768  # its longest request's keys (8192, 32768)
dist: str = "longtail"  # its length distribution (spread16, longtail, bimodal, uniform)
seed_offset: int = 1000  # the run's --seed-offset (confirm_ab.csv: 1000; ragged_ab.csv: 0)
device: str = "h200"  # the device preset the schedules are drawn for (the study's GPU)

# %%
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import catalog, devices, notebook, plots
from splitlab.errors import SplitlabError
from splitlab.planners import schedulers
from splitlab.planners import splitlab as rule
from splitlab.planners.flashmla import num_sm_parts
from splitlab.workloads import DecodeWorkload

plots.setup()
warnings.filterwarnings("ignore", category=UserWarning)
try:
    rows = pd.read_csv(catalog.bench(study).path / run, dtype={"shape": str})
except (SplitlabError, OSError) as e:
    rows = pd.DataFrame()
    display(Markdown(f"**No schedule study here** ({e}): the page needs the catalog's `{study}`."))
dev = devices.get(device)
SHAPES = {"32/8": ("gqa", 32, 8), "64/8": ("gqa", 64, 8), "128/1": ("gqa", 128, 1), "mla16": ("mla", 16, 1),
          "mla128": ("mla", 128, 1)}
PEERS = ("flashinfer", "flashinfer-fa3", "flashmla")

# %% [markdown]
# **One batch, each scheduler.** The uniform schedule is the split count v6 ran (the row `splitlab-v6` of the
# study); `balanced` is FlashInfer's chunk search in key tiles; `flashinfer` and `flashmla` are the libraries' own
# plans ported (run here on splitlab's work-list kernel); `stream_k` gives every persistent CTA the same key
# tiles. The busiest CTA's keys bound the launch; the merge reads the partial rows back.

# %%
kind, hq, hkv = SHAPES[shape]
dims = (128, 128, 16) if kind == "gqa" else (576, 512, 64)
w = DecodeWorkload(kind, batch, hq, hkv, dims[0], dims[1], longest, page_size=dims[2], length_dist=dist,
                   length_seed=batch + longest + seed_offset)
lens = list(w.lengths)
here = rows[(rows.get("shape") == shape) & (rows.get("batch") == batch) & (rows.get("longest") == longest)
            & (rows.get("dist") == dist)] if not rows.empty else rows
v6 = here[here["impl"] == "splitlab-v6"]["scheduler"] if not here.empty else pd.Series(dtype=str)
splits = int(v6.iloc[0].split(":")[1]) if len(v6) else rule.fitted_plan(w, dev).num_splits
shown = {"uniform (v6's split)": schedulers.uniform(lens, splits, request_major=rule.REQUEST_MAJOR[kind]),
         "splitlab": schedulers.splitlab(w, dev),
         "stream_k": schedulers.stream_k(lens, schedulers.slots_per_group(w, dev))}
if kind == "gqa":
    shown["flashinfer"] = schedulers.flashinfer(lens, page_size=w.page_size, num_kv_heads=hkv, sm_count=dev.sm_count)
else:
    shown["flashmla"] = schedulers.flashmla(lens, num_sm_parts(dev.sm_count, hq, 1))
measured = dict(zip(here["schedule_hash"], here["us"], strict=True)) if not here.empty else {}
peer_us = here[here["impl"].isin(PEERS)]["us"].min() if not here.empty else float("nan")

nrows = -(-len(shown) // 2)
fig, axes = plt.subplots(nrows, 2, figsize=plots.figsize(plots.PAGE_WIDTH_IN, 4.2 * nrows), sharex=True,
                         squeeze=False)
cmap = plt.get_cmap("tab20")
table = []
for ax, (name, s) in zip(axes.flat, shown.items(), strict=False):
    offsets = [0] * s.ctas
    for c, r, b, e in s.items:
        ax.barh(c, max(e - b, longest / 400), left=offsets[c], height=0.9, color=cmap(r % 20), linewidth=0)
        offsets[c] += e - b
    us = measured.get(s.digest)
    sm = s.summary()
    table.append(dict(scheduler=name, ctas=sm["ctas"], items=sm["items"], partial_rows=sm["partial_rows"],
                      busiest_keys=sm["busiest_keys"], measured_us=us, schedule_hash=s.digest))
    ax.set_title(f"{name}\n{sm['ctas']} CTAs, busiest {sm['busiest_keys']} keys\n"
                 + (f"measured {us:.0f} us" if us == us and us is not None else "not measured"),
                 fontsize=plots.MIN_FONT_PT)
    ax.set_xlabel("keys streamed by the CTA")
    ax.invert_yaxis()
for ax in axes[:, 0]:
    ax.set_ylabel("CTA slot (issue order)")
peer_note = f"; best peer {peer_us:.0f} us" if peer_us == peer_us else ""
fig.suptitle(f"{shape}, {batch} requests, {dist} up to {longest} keys (colour: request){peer_note}",
             fontsize=plots.MIN_FONT_PT + 1)
fig.tight_layout()
notebook.show_figure(fig, "one-batch", pd.DataFrame(table))

# %% [markdown]
# **Every batch of the study.** The best peer's time over splitlab's (above 1: splitlab faster), per family and
# length distribution: the split-count kernel at its planner's default (`v6`) and the work-list kernel at splitlab's
# schedule (`schedule`). Markers only: each is one batch.

# %%
if rows.empty:
    summary = pd.DataFrame()
else:
    ok = rows[rows["status"] == "ok"]
    key = ["shape", "batch", "longest", "dist"]
    peer = ok[ok["impl"].isin(PEERS)].groupby(key)["us"].min()
    t = ok.pivot_table(index=key, columns="impl", values="us", aggfunc="min")
    cmp = pd.DataFrame({"v6": peer / t["splitlab-v6"], "schedule": peer / t["wl-splitlab"]}).dropna().reset_index()
    fig, ax = plt.subplots(figsize=plots.figsize(plots.PAGE_WIDTH_IN, 4.6))
    groups = list(cmp.groupby(["shape", "dist"], sort=True))
    for i, (_, g) in enumerate(groups):
        ax.plot(np.full(len(g), i - 0.12), g["v6"], "o", color="0.6", ms=4,
                label="split count (v6)" if i == 0 else None)
        ax.plot(np.full(len(g), i + 0.12), g["schedule"], "D", color="C0", ms=4,
                label="work list, splitlab's schedule" if i == 0 else None)
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.axhline(0.9, color="0.3", lw=0.6, ls=":")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{sh} {d}" for (sh, d), _ in groups], fontsize=plots.MIN_FONT_PT, rotation=55, ha="right")
    ax.set_ylabel("best peer's time / splitlab's")
    ax.set_title("splitlab against the best peer measured in the same run, one marker per batch",
                 fontsize=plots.MIN_FONT_PT + 1)
    plots.legend_outside(ax)
    notebook.show_figure(fig, "all-batches", cmp)

    def gm(x: pd.Series) -> float:
        return math.exp(np.log(x).mean())

    ragged = cmp[cmp["dist"] != "uniform"]
    summary = ragged.groupby("shape").agg(v6=("v6", gm), schedule=("schedule", gm), worst=("schedule", "min"),
                                          batches=("schedule", "size")).round(3)
    display(Markdown("Ragged batches, geomean of the best peer's time over splitlab's (worst batch at the "
                     "schedule):\n\n" + notebook.table_html(summary)))

# %% [markdown]
# **The scheduler's regret.** Every candidate of splitlab's scheduler was timed on every batch of the study, so the
# regret of any choice is measured: the time of the schedule chosen (by its hash) over the batch's best measured
# schedule. `as run`: the schedule the scheduler made when the study ran (`wl-splitlab`); `now`: the one the shipped
# scheduler makes for the same lengths today (its constants refitted on the first run, `experiments/schedules/
# refit.py`; a schedule the study never timed would count the batch's worst). The goal: geomean <= 1.02, worst <= 1.10.

# %%
if rows.empty:
    regret = pd.DataFrame()
else:
    ok = rows[(rows["status"] == "ok") & rows["impl"].str.startswith(("wl-", "cand-"))]
    out = []
    for (sh, b, n, d), g in ok.groupby(["shape", "batch", "longest", "dist"]):
        k, h, hk = SHAPES[sh]
        dd = (128, 128, 16) if k == "gqa" else (576, 512, 64)
        wb = DecodeWorkload(k, int(b), h, hk, dd[0], dd[1], int(n), page_size=dd[2], length_dist=d,
                            length_seed=int(b) + int(n) + seed_offset)
        times = g.groupby("schedule_hash")["us"].min()
        best = times.min()
        now = times.get(schedulers.splitlab(wb, dev).digest, times.max())
        out.append(dict(shape=sh, batch=int(b), longest=int(n), dist=d, as_run=g[g["impl"] == "wl-splitlab"]["us"].min()
                        / best, now=now / best))
    regret = pd.DataFrame(out)
    by = regret.groupby("shape").agg(as_run=("as_run", lambda x: math.exp(np.log(x).mean())),
                                     as_run_worst=("as_run", "max"), now=("now", lambda x: math.exp(np.log(x).mean())),
                                     now_worst=("now", "max"), batches=("now", "size"))
    fig, ax = plt.subplots(figsize=plots.figsize(plots.PAGE_WIDTH_IN, 3.6))
    x = np.arange(len(by))
    ax.bar(x - 0.2, by["as_run"], 0.4, color="0.6", label="geomean, as run")
    ax.bar(x + 0.2, by["now"], 0.4, color="C0", label="geomean, now")
    ax.plot(x - 0.2, by["as_run_worst"], "v", color="0.3", label="worst, as run")
    ax.plot(x + 0.2, by["now_worst"], "v", color="C0", label="worst, now")
    ax.axhline(1.02, color="0.3", lw=0.6, ls=":")
    ax.axhline(1.10, color="0.3", lw=0.6, ls="--")
    ax.set_xticks(x)
    ax.set_xticklabels(by.index, fontsize=plots.MIN_FONT_PT)
    ax.set_ylim(1.0, max(1.16, float(by[["as_run_worst", "now_worst"]].max().max()) + 0.02))
    ax.set_ylabel("measured time / best measured schedule")
    ax.set_title(f"splitlab's scheduler against the best schedule of each batch ({run})",
                 fontsize=plots.MIN_FONT_PT + 1)
    plots.legend_outside(ax)
    notebook.show_figure(fig, "scheduler-regret", regret)
    display(Markdown(notebook.table_html(by.round(3))))

# %%
if not summary.empty:
    gqa = summary.loc[[s for s in summary.index if SHAPES[s][0] == "gqa"]]
    notebook.record_finding(
        f"On ragged batches splitlab's schedule runs GQA at {gqa['schedule'].min():.2f}-{gqa['schedule'].max():.2f}x "
        f"the best peer's speed (worst batch {gqa['worst'].min():.2f}x), where the split count stood at "
        f"{gqa['v6'].min():.2f}-{gqa['v6'].max():.2f}x; MLA-16 {summary.loc['mla16', 'schedule']:.2f}x "
        f"(v6 {summary.loc['mla16', 'v6']:.2f}x).")
else:
    notebook.record_finding("No schedule study in these data.")
