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
# # Split regressions: one split rule against another
#
# A *candidate* (a planner's rule, or the best point of another result set) against a *baseline* on the same shapes,
# **both planning the same kernel** (splitlab's, as swept in `data`): per shape, the time of the point the candidate
# picks over the time of the point the baseline picks (the *time ratio*; above 1: the candidate's pick is slower),
# and each one's regret against the best point measured for that shape. The default compares **splitlab's rule with
# FlashInfer's rule**, the one other rule that covers every kernel, both choosing splits (and tiles) for splitlab's
# kernels: a ratio here measures the choice, not a kernel (the kernels page compares kernels). `splitlab` is
# replayed (today's rule on the measured points) since the shipped sweeps tagged more than one version of it;
# `replay_splitlab=False` compares the choices as each sweep tagged them (two versions' sweeps: `candidate_data` and
# `baseline_data`). A shape is one call on one device (and SM count): data from several devices compare each
# device's shapes with themselves.

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

from splitlab import analysis, datasets, headline, notebook, plots, scoring
from splitlab.errors import SplitlabError

PAGE = "split_regressions"  # the report's name for this page (its CSV files start with it)
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


def is_oracle(name: str) -> bool:
    return name in ("oracle", "best", "")


def who(name: str, path: str) -> str:
    """A side as a reader names it: "splitlab's rule", "FlashInfer's rule", "the best measured point"."""
    label = "the best measured point" if is_oracle(name) else f"{headline.PLANNER_NAMES.get(name, name)}'s rule"
    return label + (f" in {path}" if path else "")


def short(name: str) -> str:
    return "best" if is_oracle(name) else headline.PLANNER_NAMES.get(name, name)


cand_label, base_label = who(candidate, candidate_data), who(baseline, baseline_data)
same_kernel = not candidate_data and not baseline_data
vs = f"{cand_label} vs {base_label}" + (", both on splitlab's kernels" if same_kernel else "")
ratio_label = f"time ratio {short(candidate)} / {short(baseline)}"
display(Markdown(f"**{vs[0].upper() + vs[1:]}.** Per shape, the *time ratio*: the p50 of the candidate's pick "
                 f"({cand_label}) over the p50 of the baseline's pick ({base_label}); a shape counts as slower "
                 f"(faster) when the ratio is above {1 + tol:.2f} (below {1 - tol:.2f})."))

# %%
keys = [c for c in analysis.SHAPE if c in df.columns]
best = analysis.oracle(df, allow_fake=allow_fake)[keys + ["p50_us", "num_splits"]].rename(
    columns={"p50_us": "oracle_us", "num_splits": "oracle_splits"})
frames, left_out = [], []
for kernel in sorted(set(cand_df["kernel"]) & set(base_df["kernel"])):
    try:
        m = analysis.compare(base_df[base_df["kernel"] == kernel], cand_df[cand_df["kernel"] == kernel],
                             base_planner=None if is_oracle(baseline) else baseline,
                             cand_planner=None if is_oracle(candidate) else candidate,
                             allow_fake=allow_fake, replayed=("splitlab",) if replay_splitlab else ())
    except SplitlabError:
        left_out.append(kernel)
        continue
    frames.append(m)
cmp_cols = keys + ["p50_us_base", "num_splits_base", "p50_us_cand", "num_splits_cand", "ratio"]
cmp = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cmp_cols)
cmp = cmp.merge(best, on=keys, how="left")
cmp["regret_cand"] = pd.to_numeric(cmp["p50_us_cand"], errors="coerce") / cmp["oracle_us"]
cmp["regret_base"] = pd.to_numeric(cmp["p50_us_base"], errors="coerce") / cmp["oracle_us"]
cmp["lengths"] = scoring.lengths_of(cmp)
cmp["family"] = [headline.FAMILIES.get(k, k) for k in cmp["kernel"]]
cmp["shape"] = [f"{r.kind} H{r.num_q_heads}/{r.num_kv_heads} B{r.batch} N{plots.fmt_pow2(r.ctx_len)}"
                + (f" top-k {r.topk}" if r.topk else "")
                + (f" {r.length_dist} seed {r.length_seed}" if r.lengths == headline.RAGGED else "")
                + (f" on {dev_label(r)}" if multi_device else "") for r in cmp.itertuples()]
valid = cmp.dropna(subset=["ratio"])
display(Markdown(f"{len(cmp)} shapes in common, {len(valid)} with both picks measured correctly"
                 + (f"; kernels without both sides' choices (the peers' kernels) left out: {', '.join(left_out)}"
                    if left_out else "") + "."))

# %% [markdown]
# ## Per family

# %%
group = ["family", "lengths", *(["device", "sm_count"] if multi_device else [])]
order = {k: i for i, k in enumerate(headline.FAMILIES.values())}
summary = valid.groupby(group, dropna=False, sort=False).agg(
    shapes=("ratio", "size"), slower=("ratio", lambda r: int((r > 1 + tol).sum())),
    faster=("ratio", lambda r: int((r < 1 - tol).sum())), geomean=("ratio", analysis.geomean),
    worst=("ratio", "max"), regret_cand=("regret_cand", analysis.geomean),
    regret_base=("regret_base", analysis.geomean)).reset_index()
summary = summary.sort_values(["family", "lengths"], key=lambda c: c.map(order) if c.name == "family" else
                              c.map({n: i for i, n in enumerate(scoring.LENGTHS)})).reset_index(drop=True)
notebook.show_table(summary.rename(columns={
    "geomean": f"geomean {ratio_label}", "worst": f"worst {ratio_label}",
    "regret_cand": f"regret of {short(candidate)}'s pick", "regret_base": f"regret of {short(baseline)}'s pick"}),
    name="family-summary", page=PAGE,
    note="Regret: p50 of a pick over the best p50 measured for the shape (geomean over the family's shapes).")

# %% [markdown]
# ## The shapes that got slower, worst first

# %%
slow = valid[valid["ratio"] > 1 + tol].sort_values("ratio", ascending=False)
cols = ["family", "shape", "num_splits_base", "num_splits_cand", "oracle_splits", "p50_us_base", "p50_us_cand",
        "ratio", "regret_base", "regret_cand"]
if slow.empty:
    display(Markdown(f"No shape is slower by more than {tol:.0%}."))
else:
    t = slow[cols].rename(columns={"num_splits_base": f"splits: {short(baseline)}",
                                   "num_splits_cand": f"splits: {short(candidate)}", "oracle_splits": "best splits",
                                   "p50_us_base": f"us: {short(baseline)}", "p50_us_cand": f"us: {short(candidate)}",
                                   "ratio": ratio_label, "regret_base": f"regret: {short(baseline)}",
                                   "regret_cand": f"regret: {short(candidate)}"}).reset_index(drop=True)
    notebook.show_table(t, top=top, name="slower", page=PAGE)

# %%
if len(valid):
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    groups = list(valid.groupby(group, dropna=False, sort=False))
    groups.sort(key=lambda kg: (order.get(kg[0][0], 9), scoring.LENGTHS.index(kg[0][1])))
    looks = plots.series_styles(range(len(groups)))
    for n, (key, g) in enumerate(groups):
        on = f" on {dev_label(g.iloc[0].to_dict())}" if multi_device else ""
        v = np.sort(g["ratio"].to_numpy(dtype=float))
        ax.plot(np.arange(1, len(v) + 1) / len(v), v, ms=3.5, lw=1.2, label=f"{key[0]} · {key[1]}{on} ({len(v)})",
                **looks[n])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(1 - tol, 1 + tol, color="#dddddd", alpha=0.6, lw=0)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.set_xlabel("share of the family's shapes (sorted by the ratio)")
    ax.set_ylabel(ratio_label)
    plots.legend_outside(ax)
    plots.title(fig, f"{vs}: time ratio per shape", info, device=where)
    notebook.show_figure(fig, "ratio", valid.reset_index(drop=True))

# %% [markdown]
# ## Every family, over context, batch and heads
#
# One panel per family (GQA, MLA, sparse MLA; same-length and ragged batches apart): each point is one shape, its
# time ratio against the context (sparse MLA: the top-k, its context being the fixed token pool); the head counts
# each in their own colour and marker, and within one context the batch grows left to right. Below the grey band
# the candidate's pick is faster, above it slower.

# %%
valid = valid.assign(panel_row=[f + (f" on {dev_label(r)}" if multi_device else "")
                                 for f, r in zip(valid["family"], valid.itertuples(), strict=True)])
# a row of panels per family (and device), splitlab's families first, then any other card's kernel
rows_ = sorted(valid["panel_row"].unique(), key=lambda r: (order.get(r.split(" on ")[0], len(order)), r))
if rows_:
    ncol = 2 if (valid["lengths"] == headline.RAGGED).any() else 1
    fig, axes = plt.subplots(len(rows_), ncol, figsize=plots.figsize(10.6, 3.1 * len(rows_) + 0.8), squeeze=False,
                             sharey=True)
    lo, hi = float(valid["ratio"].min()), float(valid["ratio"].max())
    for i, row_ in enumerate(rows_):
        for j in range(ncol):
            ax = axes[i][j]
            n = scoring.LENGTHS[j] if ncol == 2 else headline.UNIFORM
            g = valid[(valid["panel_row"] == row_) & (valid["lengths"] == n)]
            fam = row_.split(" on ")[0]
            if g.empty:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{row_} · {n} batches: no shape", ha="center", va="center",
                        transform=ax.transAxes)
                continue
            xcol = "topk" if g["ctx_len"].nunique() == 1 and g["topk"].nunique() > 1 else "ctx_len"
            fam_rows = valid[valid["family"] == fam]  # one colour per head count across the family's panels
            all_heads = fam_rows[["num_q_heads", "num_kv_heads", "head_dim_qk"]].drop_duplicates().sort_values(
                ["head_dim_qk", "num_q_heads", "num_kv_heads"])
            looks = plots.series_styles([tuple(h) for h in all_heads.itertuples(index=False)])
            heads = g[["num_q_heads", "num_kv_heads", "head_dim_qk"]].drop_duplicates().sort_values(
                ["head_dim_qk", "num_q_heads", "num_kv_heads"])
            many_d = all_heads["head_dim_qk"].nunique() > 1
            batches = sorted(g["batch"].unique())
            dodge = {b: (k / max(1, len(batches) - 1) - 0.5) * 0.5 for k, b in enumerate(batches)}
            for h in heads.itertuples(index=False):
                s = g[(g["num_q_heads"] == h.num_q_heads) & (g["num_kv_heads"] == h.num_kv_heads)
                      & (g["head_dim_qk"] == h.head_dim_qk)]
                x = s[xcol].astype(float) * np.exp2(s["batch"].map(dodge).astype(float))
                ax.scatter(x, s["ratio"], s=16, alpha=0.85, linewidths=0.4, edgecolors="white",
                           label=f"H{h.num_q_heads}/{h.num_kv_heads}" + (f" D{h.head_dim_qk}" if many_d else ""),
                           **looks[tuple(h)])
            plots.log2_axis(ax, "x", label=("context (keys)" if xcol == "ctx_len" else "top-k")
                            + ", log2; batch left to right")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.axhspan(1 - tol, 1 + tol, color="#dddddd", alpha=0.6, lw=0)
            ax.set_yscale("log", base=2)
            ax.set_ylim(min(lo, 1 - tol) / 1.1, max(hi, 1 + tol) * 1.1)
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
            if j == 0:
                ax.set_ylabel(ratio_label)
            d = "/".join(f"D{v}" for v in sorted(g["head_dim_qk"].unique()))
            ax.set_title(f"{row_.replace(fam, f'{fam} {d}', 1)} · {n} batches\n{len(g)} shapes: geomean "
                         f"{analysis.geomean(g['ratio']):.2f}x, "
                         f"{int((g['ratio'] > 1 + tol).sum())} slower")
            plots.legend_outside(ax, title="heads (q/kv)")
    plots.title(fig, f"{vs}: time ratio per shape, every family", info, device=where)
    notebook.show_figure(fig, "families", valid.reset_index(drop=True))

# %%
if len(valid):
    worst = valid.loc[valid["ratio"].idxmax()]
    n_slow, n_fast = int((valid["ratio"] > 1 + tol).sum()), int((valid["ratio"] < 1 - tol).sum())
    g = analysis.geomean(valid["ratio"])
    text = (f"{vs}, on {len(valid)} shapes: the candidate's pick is slower on {n_slow} (worst {worst['ratio']:.2f}x "
            f"at {worst['shape']}), faster on {n_fast}; geomean time ratio {g:.3f} ({short(candidate)}'s pick takes "
            f"{g:.2f}x the time of {short(baseline)}'s"
            + (", on the same kernel: a choice, not a kernel, is compared)" if same_kernel else ")"))
else:
    text = f"{cand_label} and {base_label} share no correctly measured shape"
notebook.record_finding(("MODELLED: " if info.fake else "") + text + f" ({where or info.device}, {info.date}).",
                        shapes=len(valid), slower=int((valid["ratio"] > 1 + tol).sum()) if len(valid) else 0)
