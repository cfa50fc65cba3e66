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
# # A live sweep from a notebook
#
# Runs a kernel card's `quick` grid on the GPU this kernel sees (`splitlab sweep CARD --grid quick --resume`, from
# Python), then shows each planner's regret on it and, where the shipped data hold the same shapes, how today's
# numbers compare with them. Without a GPU it says so in its first output and stops there (the rest is skipped,
# not failed), unless `timer` is `fake` (modelled times, for trying the notebook on a tiny card). A few minutes on
# an H200; a rerun with the same `out` resumes and skips the finished points.

# %% tags=["parameters"]
data: str = "h200"  # shipped result set (a catalog name) to compare today's numbers with, where it has the shapes
allow_fake: bool = False  # accept modelled rows in data (the fake timer)
card: str = "sparse_mla_decode"  # kernel card: a name in kernels/ or a path to a .toml
grid: str = "quick"  # named grid of the card
out: str = "runs/notebook"  # folder for the sweep's folder (card-grid); an existing one is resumed
max_minutes: float = 20.0  # start no new point after this many minutes (a rerun resumes)
timer: str = ""  # graph, events or fake; empty means the card's. fake runs without a GPU too (modelled times)

# %%
import os

import torch
from IPython.display import Markdown, display

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
run_here = gpu is not None or timer == "fake"
if gpu is None and not run_here:
    display(Markdown(f"**No GPU: torch sees no CUDA device on `{os.uname().nodename}`, so the sweep does not run "
                     "here.** Run this notebook (or `splitlab sweep kernels/<card>.toml --grid quick`) on a GPU node; "
                     "the cells below are skipped."))
elif gpu is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    display(Markdown(f"**No GPU on `{os.uname().nodename}`: running `{card}` grid `{grid}` with the fake timer.** "
                     "Every point is still checked (under Triton's interpreter, slow for all but tiny cards); the "
                     "times are MODELLED, not measured."))
else:
    display(Markdown(f"GPU: **{gpu}** ({torch.cuda.get_device_properties(0).multi_processor_count} SMs). Running "
                     f"`{card}` grid `{grid}` into `{out}`."))

# %%
if run_here:
    import warnings
    from pathlib import Path

    import matplotlib.pyplot as plt
    import pandas as pd

    from splitlab import analysis, datasets, notebook, plots, results
    from splitlab.bench import cards, sweep
    from splitlab.errors import SplitlabError

    plots.setup()
    notebook.show_whole_tables()
    warnings.filterwarnings("ignore", category=UserWarning)
    c = cards.load(card)
    opts = sweep.SweepOptions(grid=grid, out=Path(out), resume=True, max_minutes=max_minutes, timer=timer or None,
                              argv=["notebooks/sweep.py", card, grid] + ([f"timer={timer}"] if timer else []))
    res = sweep.run(c, opts)
    display(Markdown(f"Sweep `{res.sweep_id}` in `{res.sweep_dir}`: {res.done}/{res.total} points done "
                     f"(this session: {', '.join(f'{k} {v}' for k, v in sorted(res.statuses.items())) or 'nothing'}; "
                     f"stopped: {res.stopped})."))

# %%
if run_here:
    fresh = results.load(res.sweep_dir)
    info = datasets.data_info(res.sweep_dir)
    fake = info.fake
    display(fresh["status"].value_counts().rename("points").to_frame())
    reg = analysis.regret(fresh, allow_fake=fake)
    display(analysis.summary(reg).round(3))

# %%
if run_here:
    ok = analysis.measured(fresh, allow_fake=fake)
    ok = ok[ok["num_splits"].notna()]
    shape_cols = [x for x in analysis.SHAPE if x in ok.columns]
    shapes = list(ok.groupby(shape_cols, dropna=False).groups)[:6]
    if shapes:
        fig, axes = plt.subplots(1, len(shapes), figsize=plots.figsize(3.3 * len(shapes) + 1.3, 3.5), squeeze=False,
                                 sharey=False)
        for ax, key in zip(axes[0], shapes, strict=True):
            g = ok[(ok[shape_cols].astype(str) == pd.Series(key, index=shape_cols).astype(str)).all(axis=1)]
            for _knobs, h in g.groupby([k for k in ("block_k", "block_n", "block_h", "num_warps") if k in g
                                        and g[k].notna().any()] or ["kernel"], dropna=False):
                h = h.sort_values("num_splits")
                ax.plot(h["num_splits"], h["p50_us"], color="#999999", lw=0.8, marker=".", ms=3)
            picks = analysis.planner_choices(g)
            for name, st in plots.planner_styles(picks["planner"]).items():
                p = picks[picks["planner"] == name]
                ax.scatter(p["num_splits"], p["p50_us"], color=st["color"], marker=st["marker"], s=30, label=name,
                           zorder=3)
            plots.log2_axis(ax, "x", label="splits (log2)")
            r = g.iloc[0]
            ax.set_title(f"B{r['batch']} H{r['num_q_heads']} N{plots.fmt_pow2(r['ctx_len'])}")
        axes[0][0].set_ylabel("p50 (us)")
        plots.legend_outside(axes[0][-1])
        plots.title(fig, f"{c.name} / {grid}: p50 against splits, planners' choices marked", info)
        drawn = [ok[(ok[shape_cols].astype(str) == pd.Series(key, index=shape_cols).astype(str)).all(axis=1)]
                 for key in shapes]
        notebook.show_figure(fig, "p50-splits", pd.concat(drawn, ignore_index=True))

# %%
if run_here:
    try:
        shipped, sinfo = datasets.load_data(data, allow_fake=allow_fake)
        m = analysis.compare(shipped[shipped["kernel"] == c.name], fresh, allow_fake=allow_fake or fake)
        if m.empty:
            display(Markdown(f"The shipped data ({sinfo.label}) hold none of these shapes."))
        else:
            display(Markdown(f"Best p50 today over the shipped data's best ({sinfo.label}), per shape:"))
            display(m[["batch", "num_q_heads", "ctx_len", "topk", "p50_us_base", "p50_us_cand", "ratio"]].round(3))
    except SplitlabError as e:
        m = None
        display(Markdown(f"No comparison with the shipped data: {e}"))

# %%
from splitlab import notebook as _notebook  # noqa: E402  (also without a GPU)

if not run_here:
    _notebook.record_finding(f"Not run: no GPU on {os.uname().nodename} (the quick sweep needs a CUDA device).",
                             skipped="no GPU: skipped")  # the report's index says so in one line, without a link
else:
    s = analysis.summary(reg)
    best = s.iloc[0] if len(s) else None
    where = gpu or "no GPU, fake timer"
    text = (f"{c.name}/{grid} ({where}): {res.done}/{res.total} points; lowest geomean regret "
            f"{best['planner']} {best['geomean']:.2f}x" if best is not None else f"{c.name}/{grid}: no planner choice")
    if m is not None and len(m):
        text += f"; against the shipped data, geomean ratio of the best p50 {analysis.geomean(m['ratio']):.3f}"
    _notebook.record_finding(("MODELLED: " if fake else "") + text + ".")
