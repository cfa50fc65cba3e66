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
# # Timelines: which SM ran which program when, and where the time to the roofline goes
#
# A decode's time says how far it is from the roofline floor, not why. The work-list kernels can record, per
# program, the SM it ran on and when it started and ended (`kernels.timeline`); the cost model places the same
# programs on the SMs as it prices them (`planners.timeline`). Above: one point's programs, one row per SM, the
# model's placement above the GPU's. Below: the gap ledger across shapes (`splitlab.ledger`): the measured time
# minus the floor, split into launch and fixed cost, idle SMs (waves and tail imbalance), the merge, streaming
# below the peak inside busy CTAs, bytes the floor does not count, what recording the timeline changed (the plain
# build's time against the instrumented one's), the CUDA-graph replay's own fixed cost shared by the calls of a
# timing, and what is left unexplained. Where no measured timeline set is in the catalog
# (`experiments/timelines/collect.py` writes one on the H200), the page draws the model's timelines and the model's
# shares only, and says so. Given `sweep` (a folder recorded with `splitlab sweep --timelines`,
# `splitlab.sweep_timelines`) and `point`, the Gantt charts are that point's.

# %% tags=["parameters"]
data: str = "h200"  # the report's result set; this page draws its own shapes (the device below)
allow_fake: bool = False  # (nothing here is read from the sweeps)
timelines: str = "h200-timelines"  # the catalog bench entry holding experiments/timelines/collect.py's CSVs
measured: str = ""  # a folder of those CSVs, read instead of the catalog's entry (empty: the catalog's)
device: str = "h200"  # the device preset the model places the programs on
shape: str = "32/8"  # the point drawn as Gantt charts: its shape (32/8, 128/1, mla16)
batch: int = 16  # its requests (16, 64; the shipped set holds the records of batch 16)
longest: int = 8192  # its longest request's keys (8192, 32768)
dist: str = "longtail"  # its length distribution (uniform, spread16, longtail)
scheduler: str = "splitlab"  # its schedule: splitlab's scheduler, or uniform (the fitted plan's split)
sweep: str = ""  # a sweep folder recorded with `splitlab sweep --timelines`: its point below is drawn instead
point: str = ""  # that sweep's point id (empty: its first point with records)

# %%
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import catalog, devices, ledger, notebook, plots, results, sweep_timelines
from splitlab.errors import SplitlabError
from splitlab.planners import schedulers
from splitlab.planners import splitlab as rule
from splitlab.planners.timeline import modelled_timeline
from splitlab.workloads import DecodeWorkload

plots.setup()
warnings.filterwarnings("ignore", category=UserWarning)
dev = devices.get(device)
#: The collection's shapes (experiments/timelines/collect.py: label, kind, q heads, kv heads, dims, page).
SHAPES = {"32/8": ("gqa", 32, 8, (128, 128), 16), "128/1": ("gqa", 128, 1, (128, 128), 16),
          "mla16": ("mla", 16, 1, (576, 512), 64)}
DISTS = ("uniform", "spread16", "longtail")
points = pd.DataFrame()
programs = pd.DataFrame()
try:
    folder = Path(measured) if measured else catalog.bench(timelines).path
    points = pd.read_csv(folder / "points.csv", dtype={"shape": str})
    # the collection writes timelines.csv; the shipped set is gzipped (pandas reads either)
    records = next((f for f in (folder / "timelines.csv", folder / "timelines.csv.gz") if f.exists()),
                   folder / "timelines.csv")
    programs = pd.read_csv(records, dtype={"shape": str})
    points = points[points["status"] == "ok"]
    source = f"`{folder.name}`" + (" (given as `measured`)" if measured else f" (catalog `{timelines}`)")
except (SplitlabError, OSError) as e:
    source = None
    display(Markdown(f"**No measured timeline set in the catalog** ({e}). The charts below are the cost model's "
                     f"timelines only ({plots.MODELLED.split(',')[0]} by the model, not measured): "
                     "`experiments/timelines/collect.py` writes the set on the H200."))
if source is not None:
    notes = sorted(set(points["note"].dropna())) if "note" in points else []
    display(Markdown(f"Measured timelines from {source}: {len(points)} points."
                     + "".join(f" **{n}**." for n in notes)))
    source = source.replace("`", "")  # (figure titles)


def workload(label: str, b: int, n: int, d: str) -> DecodeWorkload:
    kind, hq, hkv, (dqk, dv), page = SHAPES[label]
    return DecodeWorkload(kind, b, hq, hkv, dqk, dv, n, page_size=page, length_dist=d,
                          length_seed=0 if d == "uniform" else b + n)


def sweep_point(folder: str, pid: str):
    """A sweep's recorded point (``splitlab sweep --timelines``): its workload, its schedule made again (checked
    against the row's hash), its records (``sweep_timelines``), a title and the device it was planned for."""
    recorded = sweep_timelines.load(folder)
    if recorded.empty:
        raise SplitlabError(f"{Path(folder).name}: no timelines recorded; expected a sweep run with --timelines")
    pid = pid or recorded["point_id"].iloc[0]
    rows = results.load(folder)
    row = rows[rows["point_id"] == pid]
    if row.empty or pid not in set(recorded["point_id"]):
        raise SplitlabError(f"point={pid!r} is not allowed; expected a point of {Path(folder).name} with records")
    row = row.iloc[0]
    wk, on = results.workload(row), devices.get(row["device"])
    splits = None if pd.isna(row["num_splits"]) else int(row["num_splits"])  # set for uniform only
    sched = schedulers.schedule(wk, on, row["scheduler"], num_splits=splits)
    if sched.digest != row["schedule_hash"]:  # balanced / stream_k over a card's CTA count (the row's slots)
        sched = schedulers.schedule(wk, on, row["scheduler"], num_splits=splits, ctas=int(row["sched_ctas"]))
    if sched.digest != row["schedule_hash"]:
        raise SplitlabError(f"point {pid}: the schedule made again is not the one recorded ({sched.digest} != "
                            f"{row['schedule_hash']}); expected the splitlab that ran the sweep")
    title = (f"sweep {Path(folder).name}, point {pid}: {wk.kind} {wk.num_q_heads}/{wk.num_kv_heads}, {wk.batch} "
             f"requests ({wk.length_dist}) up to {wk.ctx_len} keys, {row['scheduler']}'s schedule")
    return wk, sched, recorded[recorded["point_id"] == pid], title, on


def schedule_of(w: DecodeWorkload, name: str):
    if name == "uniform":
        return schedulers.uniform(list(w.lengths), rule.fitted_plan(w, dev).num_splits,
                                  request_major=rule.REQUEST_MAJOR[w.kind])
    return schedulers.splitlab(w, dev)


# %% [markdown]
# **One point, per SM.** Each bar is one program of the partial kernel on the SM that ran it (colour: its CTA slot,
# so a persistent slot's items and a slot's head groups share a colour); grey bars after them are the merge's
# programs. The model's times are in its own unit (key tiles of one CTA) unless a measurement scales them to
# microseconds (its partial span), so the two charts share the x axis only then.

# %%
if sweep:
    w, s, mine, point_title, pdev = sweep_point(sweep, point)
    gantt_source = f"sweep {Path(sweep).name}"
else:
    gantt_source, pdev = source, dev
    w = workload(shape, batch, longest, dist)
    s = schedule_of(w, scheduler)
    key = dict(shape=shape, batch=batch, longest=longest, dist=dist, scheduler=scheduler)
    mine = programs
    for k, v in key.items():
        mine = mine[mine[k] == v] if not mine.empty else mine
    point_title = f"{shape}, {batch} requests, {dist} up to {longest} keys, {scheduler}'s schedule"
model = modelled_timeline(s, w, pdev)
clocked = mine[mine["start_ns"] >= 0] if not mine.empty else mine  # -1: recorded without a clock (no GPU)
if not sweep and source is not None and mine.empty:
    display(Markdown(f"**{source} holds no records of this point** (the shipped set holds batch 16's records; the "
                     "ledgers of every point are in its points.csv); the model's chart only."))
if sweep and clocked.empty:
    display(Markdown(f"**The {gantt_source} records of this point hold no clock** (recorded under Triton's "
                     "interpreter or `--timer fake`: which program ran which work, not where or when); the model's "
                     "chart only."))
part = clocked[clocked["kernel"] == "partial"] if not clocked.empty else clocked
merge = clocked[clocked["kernel"] == "merge"] if not clocked.empty else clocked
t0 = part["start_ns"].min() if not part.empty else 0
if not part.empty:
    span_us = (part["end_ns"].max() - t0) / 1e3
    model = model.scaled(span_us * model.total / model.launch)  # the model's launch lasts the measured span
cmap = plt.get_cmap("tab20")
rows = 2 if not part.empty else 1
fig, axes = plt.subplots(rows, 1, figsize=plots.figsize(plots.PAGE_WIDTH_IN, 4.6 * rows), squeeze=False,
                         sharex=not part.empty)
ax = axes[0, 0]
for p in model.programs:
    ax.barh(p.sm, p.end - p.start, left=p.start, height=0.8, color=cmap(p.slot % 20), linewidth=0)
if model.tail > 0:
    ax.axvspan(model.launch, model.total, color="0.85", lw=0)
unit = "us" if model.units == "us" else model.units
ax.set_title(f"modelled ({'scaled to the measured span' if unit == 'us' else 'the cost model, not measured'}): "
             f"launch {model.launch:.1f}, then partial writes and merge {model.tail:.1f} ({unit})",
             fontsize=plots.MIN_FONT_PT)
ax.set_ylabel("SM")
ax.set_xlabel(f"time ({unit})")
ax.invert_yaxis()
table = pd.DataFrame([dict(source="model", program=p.program, slot=p.slot, sm=p.sm, start=p.start, end=p.end)
                      for p in model.programs])
if not part.empty:
    ax = axes[1, 0]
    for _, r in part.iterrows():
        ax.barh(r["sm"], (r["end_ns"] - r["start_ns"]) / 1e3, left=(r["start_ns"] - t0) / 1e3, height=0.8,
                color=cmap(int(r["slot"]) % 20), linewidth=0)
    for _, r in merge.iterrows():
        ax.barh(r["sm"], (r["end_ns"] - r["start_ns"]) / 1e3, left=(r["start_ns"] - t0) / 1e3, height=0.8,
                color="0.55", linewidth=0)
    ax.set_title(f"measured ({gantt_source}): partial kernel, then merge (grey)", fontsize=plots.MIN_FONT_PT)
    ax.set_ylabel("SM")
    ax.set_xlabel("time since the first program started (us)")
    ax.invert_yaxis()
    got = pd.DataFrame(dict(source="measured-" + clocked["kernel"], program=clocked["program"],
                            slot=clocked["slot"], sm=clocked["sm"], start=(clocked["start_ns"] - t0) / 1e3,
                            end=(clocked["end_ns"] - t0) / 1e3))
    table = pd.concat([table, got], ignore_index=True)
fig.suptitle(f"{point_title}: {s.ctas} slots, {len(model.programs)} programs on {pdev.name}'s {pdev.sm_count} SMs",
             fontsize=plots.MIN_FONT_PT + 1)
fig.tight_layout()
notebook.show_figure(fig, "gantt", table)

# %% [markdown]
# **The ledger across shapes.** Measured: each point's gap to the floor in its parts, as fractions of the measured
# time (`splitlab.ledger`; the floor is the rest of the bar to 1; `recording` is below 0 where recording slowed the
# launch, `below_peak` where busy SMs streamed at the peak while others idled, and `idle` then counts SM-time that
# cost no time). Without a measured set, the model's own shares of its time: the launch's busy SM-time, its idle
# SM-time (waves and tail imbalance: the time an SM has no program resident, averaged over the SMs), and the partial
# writes and merge after it.

# %%
PART_COLORS = dict(zip(ledger.PARTS, ["0.45", "C1", "C4", "C0", "C2", "C8", "C7", "C3"], strict=True))
if not points.empty:
    t = points.assign(label=points["shape"] + " B" + points["batch"].astype(str) + " "
                      + (points["longest"] // 1024).astype(str) + "K " + points["dist"] + " " + points["scheduler"])
    older = [p for p in ledger.PARTS if f"{p}_us" not in t]  # a set written before these parts: 0, said so
    if older:
        display(Markdown(f"{source} has no {', '.join(older)} part (written before the ledger had them): drawn as 0, "
                         "their time is in `unexplained`."))
    shares = pd.DataFrame({p: t[f"{p}_us"] / t["measured_us"] if p not in older else 0.0 for p in ledger.PARTS},
                          index=t.index)
    shares.insert(0, "floor", t["floor_us"] / t["measured_us"])
    shares.index = t["label"]
    title = f"measured gap ledger ({source}), as fractions of each point's measured time"
    colors = ["0.85", *[PART_COLORS[p] for p in ledger.PARTS]]
else:
    rows_ = []
    for label in SHAPES:
        for d in DISTS:
            wk = workload(label, batch, longest, d)
            m = modelled_timeline(schedule_of(wk, scheduler), wk, dev)
            busy = sum(ledger.busy_ns((p.sm, p.start, p.end) for p in m.programs).values()) / dev.sm_count
            rows_.append(dict(label=f"{label} {d}", busy=busy / m.total, idle=(m.launch - busy) / m.total,
                              tail=m.tail / m.total))
    shares = pd.DataFrame(rows_).set_index("label")
    title = (f"MODELLED (the cost model, not measured): shares of the modelled time, {batch} requests up to "
             f"{longest} keys, {scheduler}'s schedule")
    colors = ["C0", "C1", "C4"]
fig, ax = plt.subplots(figsize=plots.figsize(plots.PAGE_WIDTH_IN, 4.4))
bottom = np.zeros(len(shares))
for col, color in zip(shares.columns, colors, strict=True):
    vals = shares[col].to_numpy(dtype=float)
    ax.bar(range(len(shares)), vals, bottom=bottom, color=color, label=col, width=0.75)
    bottom = bottom + vals
ax.set_xticks(range(len(shares)))
ax.set_xticklabels(shares.index, rotation=55, ha="right", fontsize=plots.MIN_FONT_PT)
ax.set_ylabel("fraction of the time")
ax.set_title(title, fontsize=plots.MIN_FONT_PT + 1)
plots.legend_outside(ax)
notebook.show_figure(fig, "ledger", shares.round(4))

# %%
if not points.empty:
    unexpl = (points["unexplained_us"].abs() / points["measured_us"])
    notebook.record_finding(
        f"Measured ({len(points)} points): the ledger leaves {unexpl.median():.1%} of the measured time unexplained "
        f"at the median ({(unexpl <= 0.05).mean():.0%} of points within 5%); recording the timeline costs "
        f"{points['overhead'].median():.1%} of the plain launch at the median (worst {points['overhead'].max():.1%}).")
else:
    idle = shares["idle"]
    notebook.record_finding(
        f"MODELLED, no measured timeline set yet: in the cost model idle SMs take {idle.min():.0%}-{idle.max():.0%} "
        f"of the modelled time across the shipped shapes at {batch} requests up to {longest} keys "
        f"({scheduler}'s schedule); the measured ledger awaits experiments/timelines on the H200.")
