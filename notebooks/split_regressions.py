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
# # Split regressions: a candidate against a baseline
#
# A *candidate* (a planner's choices, or the best of another result set) against a *baseline* on the same shapes:
# per shape, each one's regret against the measured optimum (p50 over the best p50 measured for that shape in
# `data`), the ratio candidate / baseline (above 1: the candidate is slower), the shapes that got slower sorted by
# how much, and the ratio as a heatmap over batch and context. The default compares splitlab's own planner with
# FlashInfer's, the one other planner that covers every kernel. `splitlab` is replayed (today's rule on the measured
# points) since the shipped sweeps tagged more than one version of it; `replay_splitlab=False` compares the choices
# as each sweep tagged them (two versions' sweeps: `candidate_data` and `baseline_data`). A shape is one call on one
# device (and SM count): data from several devices compare each device's shapes with themselves.

# %% tags=["parameters"]
data: str = "h200"  # result set: a catalog name (data/catalog.toml) or a folder of sweeps; h200: the current set
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
candidate: str = "splitlab"  # a planner name, or oracle for the best measured point of candidate_data
candidate_data: str = ""  # result set the candidate's times come from; empty means data
baseline: str = "flashinfer"  # a planner name, or oracle
baseline_data: str = ""  # result set the baseline's times come from; empty means data
tol: float = 0.02  # slower (or faster) by more than this share counts
top: int = 25  # rows of the sorted table of regressions
replay_splitlab: bool = True  # score `splitlab` by replaying today's rule (the data's tags mix its versions)

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import analysis, datasets, notebook, plots
from splitlab.errors import SplitlabError

plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)
df, info = datasets.load_data(data, allow_fake=allow_fake)
cand_df = datasets.load_data(candidate_data, allow_fake=allow_fake)[0] if candidate_data else df
base_df = datasets.load_data(baseline_data, allow_fake=allow_fake)[0] if baseline_data else df
display(Markdown(datasets.describe(info, df)))
dev_cols = [c for c in ("device", "sm_count") if c in df.columns]
devs = df[dev_cols].drop_duplicates().to_dict("records") if dev_cols else []
multi_device = len(devs) > 1


def dev_label(r) -> str:
    name = r.get("device") if isinstance(r, dict) else getattr(r, "device", None)
    sms = r.get("sm_count") if isinstance(r, dict) else getattr(r, "sm_count", None)
    return f"{name}" + (f" ({sms} SMs)" if sms is not None and not pd.isna(sms) else "")


where = ", ".join(dev_label(d) for d in devs) if multi_device else None  # figure titles name every device
if multi_device:
    display(Markdown(f"**{len(devs)} devices:** {where}. Each shape is compared on its own device."))


def who(name: str, path: str) -> str:
    label = "best measured" if name in ("oracle", "best", "") else name
    return label + (f" in {path}" if path else "")


cand_label, base_label = who(candidate, candidate_data), who(baseline, baseline_data)
display(Markdown(f"**Candidate:** {cand_label}. **Baseline:** {base_label}. A shape counts as slower (faster) when "
                 f"the ratio is above {1 + tol:.2f} (below {1 - tol:.2f})."))

# %%
keys = [c for c in analysis.SHAPE if c in df.columns]
best = analysis.oracle(df, allow_fake=allow_fake)[keys + ["p50_us", "num_splits"]].rename(
    columns={"p50_us": "oracle_us", "num_splits": "oracle_splits"})
frames, notes = [], []
for kernel in sorted(set(cand_df["kernel"]) & set(base_df["kernel"])):
    try:
        m = analysis.compare(base_df[base_df["kernel"] == kernel], cand_df[cand_df["kernel"] == kernel],
                             base_planner=None if baseline in ("oracle", "best", "") else baseline,
                             cand_planner=None if candidate in ("oracle", "best", "") else candidate,
                             allow_fake=allow_fake, replayed=("splitlab",) if replay_splitlab else ())
    except SplitlabError as e:
        notes.append(f"- {kernel}: {e}")
        continue
    frames.append(m)
if notes:
    display(Markdown("Kernels left out:\n" + "\n".join(notes)))
cmp_cols = keys + ["p50_us_base", "num_splits_base", "p50_us_cand", "num_splits_cand", "ratio"]
cmp = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cmp_cols)
cmp = cmp.merge(best, on=keys, how="left")
cmp["regret_cand"] = pd.to_numeric(cmp["p50_us_cand"], errors="coerce") / cmp["oracle_us"]
cmp["regret_base"] = pd.to_numeric(cmp["p50_us_base"], errors="coerce") / cmp["oracle_us"]
cmp["shape"] = [f"{r.kind} H{r.num_q_heads}/{r.num_kv_heads} B{r.batch} N{plots.fmt_pow2(r.ctx_len)}"
                + (f" top-k {r.topk}" if r.topk else "") + (f" on {dev_label(r)}" if multi_device else "")
                for r in cmp.itertuples()]
valid = cmp.dropna(subset=["ratio"])
display(Markdown(f"{len(cmp)} shapes in common, {len(valid)} with both choices measured correctly."))

# %% [markdown]
# ## Per kernel

# %%
summary = valid.groupby(["kernel", *(["device", "sm_count"] if multi_device else [])], dropna=False).agg(
    shapes=("ratio", "size"), slower=("ratio", lambda r: int((r > 1 + tol).sum())),
    faster=("ratio", lambda r: int((r < 1 - tol).sum())), geomean_ratio=("ratio", analysis.geomean),
    worst_ratio=("ratio", "max"), regret_candidate=("regret_cand", analysis.geomean),
    regret_baseline=("regret_base", analysis.geomean))
display(summary.round(3))

# %% [markdown]
# ## The shapes that got slower, worst first

# %%
slow = valid[valid["ratio"] > 1 + tol].sort_values("ratio", ascending=False)
cols = ["kernel", "shape", "num_splits_base", "num_splits_cand", "oracle_splits", "p50_us_base", "p50_us_cand",
        "ratio", "regret_base", "regret_cand"]
if slow.empty:
    display(Markdown(f"No shape is slower by more than {tol:.0%}."))
else:
    t = slow[cols].head(top).rename(columns={"num_splits_base": "splits (base)", "num_splits_cand": "splits (cand)",
                                             "oracle_splits": "best splits", "p50_us_base": "base us",
                                             "p50_us_cand": "cand us"})
    display(t.round(3).reset_index(drop=True))
    if len(slow) > top:
        display(Markdown(f"... and {len(slow) - top} more."))

# %%
if len(valid):
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    groups = list(valid.groupby(["kernel", *(["device", "sm_count"] if multi_device else [])], dropna=False))
    looks = plots.series_styles(range(len(groups)))
    for n, (key, g) in enumerate(groups):
        kernel = key[0] if isinstance(key, tuple) else key
        on = f" on {dev_label(g.iloc[0].to_dict())}" if multi_device else ""
        v = np.sort(g["ratio"].to_numpy(dtype=float))
        ax.plot(np.arange(1, len(v) + 1) / len(v), v, ms=3.5, lw=1.2, label=f"{kernel}{on} ({len(v)})", **looks[n])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(1 - tol, 1 + tol, color="#dddddd", alpha=0.6, lw=0)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.set_xlabel("share of shapes (sorted by ratio)")
    ax.set_ylabel(f"{candidate} / {baseline} (p50)")
    plots.legend_outside(ax)
    plots.title(fig, f"{cand_label} against {base_label}: p50 ratio per shape", info, device=where)
    notebook.show_figure(fig, "ratio", valid.reset_index(drop=True))

# %% [markdown]
# ## Over batch and context
#
# The ratio candidate / baseline per shape (orange: the candidate is slower; blue: faster; hatched: not measured).
# For sparse MLA the context is the token pool and fixed, so top-k takes its place.

# %%
fam_cols = [c for c in keys if c not in ("batch", "ctx_len", "topk")]
panels = []
for fam, g in valid.groupby(fam_cols, dropna=False):
    xcol = "ctx_len" if g["ctx_len"].nunique() > 1 else "topk"
    if g[xcol].nunique() < 1 or g["batch"].nunique() < 1:
        continue
    panels.append((dict(zip(fam_cols, fam, strict=True)), xcol, g))
panels = sorted(panels, key=lambda p: (p[0]["kernel"], -len(p[2])))[:12]
if panels:
    ncol = min(2, len(panels))
    nrow = int(np.ceil(len(panels) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=plots.figsize(4.8 * ncol, 3.4 * nrow + 0.8), squeeze=False)
    lim = float(np.nanmax(np.abs(np.log2(valid["ratio"].astype(float))))) if len(valid) else 1.0
    lim = max(lim, 0.05)
    for ax, (fam, xcol, g) in zip(axes.flat, panels, strict=False):
        t = g.pivot_table(index="batch", columns=xcol, values="ratio", aggfunc="max")
        hm = plots.log2_heatmap(ax, t, cmap=plots.RATIO_CMAP, log_color=True, vmin=2**-lim, vmax=2**lim, annot=t,
                                fmt="{:.2f}", colorbar=False,
                                xlabel=("context" if xcol == "ctx_len" else "top-k") + " (log2)", ylabel="batch (log2)")
        ax.set_title(f"{fam['kernel']}: H{fam['num_q_heads']}/{fam['num_kv_heads']} D{fam['head_dim_qk']}"
                     + (f" on {dev_label(fam)}" if multi_device else ""))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    plots.colorbar(hm, axes, label=f"{candidate} / {baseline} (p50)", ratio_ticks=True, location="top", shrink=0.5,
                   aspect=40)
    plots.title(fig, f"{cand_label} / {base_label} over batch and context", info, device=where)
    notebook.show_figure(fig, "ratio-heatmap", pd.concat([g for _, _, g in panels], ignore_index=True))

# %%
if len(valid):
    worst = valid.loc[valid["ratio"].idxmax()]
    n_slow, n_fast = int((valid["ratio"] > 1 + tol).sum()), int((valid["ratio"] < 1 - tol).sum())
    text = (f"{cand_label} against {base_label} on {len(valid)} shapes: slower on {n_slow} (worst "
            f"{worst['ratio']:.2f}x at {worst['kernel']} {worst['shape']}), faster on {n_fast}; geomean ratio "
            f"{analysis.geomean(valid['ratio']):.3f}")
else:
    text = f"{cand_label} and {base_label} share no correctly measured shape"
notebook.record_finding(("MODELLED: " if info.fake else "") + text + f" ({where or info.device}, {info.date}).",
                        shapes=len(valid), slower=int((valid["ratio"] > 1 + tol).sum()) if len(valid) else 0)
