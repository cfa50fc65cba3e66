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
# # Latency against CTA count: where the best knob switches
#
# Every measured point of splitlab's kernels plotted against the CTAs its partial launch makes, colored by the
# knob under study (the split count; BLOCK_K where both values were measured), with the SM count and its
# multiples marked. Above: bandwidth (unique KV bytes over p50). Below: p50 over the best p50 of the same shape,
# so that shapes of very different size share one axis and the best points sit on 1.
#
# Two rules are then scored on the measured points the way seed 003 scores its rule (a count of load points it
# predicts): seed 003's **BLOCK_K = 32 once CTAs > SMs** (aiter, proposed for gfx950), and its analogue for the
# split count, **split until one more doubling would pass the SM count** (the largest power-of-two split whose
# CTAs fit in one wave).

# %% tags=["parameters"]
data: str = "h200"  # result set: a catalog name (data/catalog.toml) or a folder of sweeps; h200: the current set
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
kernels: list = []  # kernels to show; empty means every kernel in the data with a CTA count
max_families: int = 3  # shape families (heads, head dims, top-k) per kernel in the figures
tol: float = 0.01  # two p50s within this relative distance are a tie

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import analysis, datasets, notebook, plots

plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)
df, info = datasets.load_data(data, allow_fake=allow_fake)
display(Markdown(datasets.describe(info, df)))

ok = analysis.measured(df, allow_fake=allow_fake)
ok = ok[ok["ctas"].notna() & ok["num_splits"].notna() & ok["p50_us"].notna()].copy()
shape_cols = [c for c in analysis.SHAPE if c in ok.columns]
family_cols = [c for c in shape_cols if c not in ("batch", "ctx_len")]
ok["best_us"] = ok.groupby(shape_cols, dropna=False)["p50_us"].transform("min")
ok["rel"] = ok["p50_us"] / ok["best_us"]
todo = [k for k in (kernels or sorted(ok["kernel"].unique()))]
missing = [k for k in todo if k not in set(ok["kernel"])]
if missing:
    display(Markdown(f"No measured points with a CTA count for: {', '.join(missing)}."))
todo = [k for k in todo if k in set(ok["kernel"])]
display(Markdown(f"{len(ok)} measured points with a CTA count, kernels: {', '.join(todo) or 'none'}."))


# %%
def family_label(row: pd.Series) -> str:
    s = f"{row['kind']} H{row['num_q_heads']}/{row['num_kv_heads']} D{row['head_dim_qk']}"
    return s + (f" top-k {row['topk']}" if row["topk"] else "")


def default_tile(g: pd.DataFrame, keep: tuple[str, ...]) -> pd.DataFrame:
    """The rows at the family's most common value of every knob not in ``keep`` (the default tile)."""
    for k in analysis.KNOBS:
        if k in keep or k not in g.columns or g[k].isna().all():
            continue
        g = g[g[k] == g[k].mode().iloc[0]]
    return g


# %% [markdown]
# ## Bandwidth and relative latency against CTAs

# %%
for kernel in todo:
    kd = ok[ok["kernel"] == kernel]
    sm = int(kd["sm_count"].dropna().iloc[0]) if kd["sm_count"].notna().any() else info.sm_count
    counts = kd.groupby(family_cols, dropna=False).size().sort_values(ascending=False)
    fams = counts.index[:max_families]
    def _label(f) -> str:
        return family_label(pd.Series(dict(zip(family_cols, f, strict=True))))

    shown_labels = {_label(f) for f in fams}
    rest = [x for x in dict.fromkeys(_label(f) for f in counts.index) if x not in shown_labels]
    if rest:  # say which families the panels leave out (max_families); their points are in the data
        display(Markdown(f"**{kernel}:** the panels show the {len(fams)} families with the most points "
                         f"(`max_families`); not drawn: {', '.join(rest)}."))
    two_bk = kd["block_k"].dropna().nunique() >= 2
    fig, axes = plt.subplots(2, len(fams), figsize=plots.figsize(3.9 * len(fams) + 1.3, 6.4), squeeze=False,
                             sharex="col")
    drawn = []
    for j, fam in enumerate(fams):
        g = kd[(kd[family_cols].astype(str) == pd.Series(fam, index=family_cols).astype(str)).all(axis=1)]
        g = default_tile(g, ("num_splits", "block_k") if two_bk else ("num_splits",))
        drawn.append(g.assign(family=family_label(g.iloc[0])))
        for i, (col, ylab) in enumerate((("gbps", "GB/s (unique KV / p50)"), ("rel", "p50 / best p50 of the shape"))):
            ax = axes[i][j]
            if two_bk:
                looks = (dict(color="#1f77b4", s=14), dict(facecolor="none", edgecolor="#ff7f0e", s=34, linewidth=1.1))
                for bk, look in zip(sorted(g["block_k"].dropna().unique()), looks, strict=False):
                    h = g[g["block_k"] == bk]
                    ax.scatter(h["ctas"], h[col], alpha=0.85, label=f"BLOCK_K {bk}", **look)
            else:
                sc = ax.scatter(g["ctas"], g[col], s=12, c=np.log2(g["num_splits"].astype(float)), cmap="viridis",
                                alpha=0.8)
            plots.log2_axis(ax, "x")
            if col == "rel":
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
            ax.set_ylabel(ylab if j == 0 else "")
            if i == 0:
                ax.set_title(family_label(g.iloc[0]))
            else:
                ax.set_xlabel("CTAs of the partial launch (log2)")
            plots.mark_sm_multiples(ax, sm, label=(i == 0))
    if two_bk:
        plots.legend_outside(axes[0][-1])
    else:
        cb = fig.colorbar(sc, ax=axes[:, -1].tolist(), shrink=0.8, pad=0.02)
        cb.set_label("splits (log2)")
        cb.ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{2 ** v:g}"))
    plots.title(fig, f"{kernel}: bandwidth and relative latency against CTAs", info)
    cols = ["family", *shape_cols, *[k for k in analysis.KNOBS if k in ok.columns], "ctas", "p50_us", "best_us",
            "rel", "gbps"]
    notebook.show_figure(fig, kernel.lower(), pd.concat(drawn, ignore_index=True)[list(dict.fromkeys(cols))])

# %% [markdown]
# ## Where the best BLOCK_K switches, and seed 003's rule
#
# Each load point is one shape at one split count with both BLOCK_K values measured. `gain of 32` is p50 at
# BLOCK_K 64 over p50 at BLOCK_K 32: above 1, the smaller tile is faster. The rule predicts 32 right of the SM
# line and 64 left of it. Points within the tie tolerance count for no side.

# %%
rule = analysis.cta_rule(ok, tol=tol)
bk_summary = None
if rule.empty:
    display(Markdown("The data hold no load point with both BLOCK_K 32 and 64 measured: seed 003's rule cannot be "
                     "scored here."))
else:
    dec = rule[rule["decisive"]]
    hit = int(dec["predicted"].sum())
    sm = int(rule["sm_count"].dropna().iloc[0]) if rule["sm_count"].notna().any() else info.sm_count
    # The threshold in hindsight: the T that makes "32 if ctas > T" right most often on the decisive points
    # (T = 0: always 32; T = the largest CTA count: never 32).
    top_ctas = int(rule["ctas"].max())
    best_t, best_hits = sm, hit
    for t in [0, *sorted(set(rule["ctas"].astype(int)))]:
        hits = int(sum((32 if c > t else 64) == b for c, b in zip(dec["ctas"], dec["best"], strict=True)))
        if hits > best_hits:
            best_t, best_hits = t, hits
    if best_t >= top_ctas:
        hindsight = f"never switch (BLOCK_K 64 everywhere) is right on {best_hits} of {len(dec)}"
    elif best_t == 0:
        hindsight = f"always BLOCK_K 32 is right on {best_hits} of {len(dec)}"
    else:
        hindsight = f"switching above {best_t} CTAs ({best_t / sm:.2g}x SMs) is right on {best_hits} of {len(dec)}"
    bk_summary = dict(points=len(rule), decisive=len(dec), predicted=hit, best_threshold=best_t,
                      best_threshold_hits=best_hits, sm_count=sm, hindsight=hindsight)
    display(Markdown(f"**Seed 003's rule** (32 once CTAs > {sm}) predicts **{hit} of {len(dec)}** decisive load "
                     f"points ({len(rule) - len(dec)} ties within {tol:.0%}). In hindsight, {hindsight}."))
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for pred, color, marker, lab in ((True, "#0072B2", "o", "rule right"), (False, "#D55E00", "X", "rule wrong")):
        h = dec[dec["predicted"] == pred]
        ax.scatter(h["ctas"], h["gain_small"], s=20, color=color, marker=marker, label=f"{lab} ({len(h)})")
    ties = rule[~rule["decisive"]]
    ax.scatter(ties["ctas"], ties["gain_small"], s=12, color="#999999", label=f"tie within {tol:.0%} ({len(ties)})")
    ax.axhline(1.0, color="black", lw=0.8)
    plots.log2_axis(ax, "x", label="CTAs of the partial launch (log2)")
    ax.set_ylabel("gain of BLOCK_K 32 (p50@64 / p50@32)")
    plots.mark_sm_multiples(ax, sm)
    if 0 < best_t < top_ctas and best_t != sm:
        ax.axvline(best_t, color="#9467bd", lw=1.0, ls="-.", label=f"best threshold in hindsight: {best_t}")
    plots.legend_outside(ax)
    plots.title(fig, f"BLOCK_K 32 vs 64: the rule predicts {hit} of {len(dec)} decisive load points", info)
    notebook.show_figure(fig, "block-k-rule", rule.reset_index(drop=True))
    # The load points that matter: where the rule picks the slower tile, by how much slower its pick is.
    wrong = dec[~dec["predicted"]].copy()
    wrong["cost"] = [max(s, lg) / min(s, lg) for s, lg in zip(wrong["p50_small"], wrong["p50_large"], strict=True)]
    cols = [c for c in ("kernel", "num_q_heads", "topk", "batch", "num_splits", "ctas", "p50_small", "p50_large",
                        "best", "rule", "cost") if c in wrong.columns]
    notebook.show_table(
        wrong.sort_values("cost", ascending=False)[cols].rename(columns={
            "num_q_heads": "heads", "p50_small": "p50 @32 (us)", "p50_large": "p50 @64 (us)", "best": "best BLOCK_K",
            "rule": "rule's BLOCK_K", "cost": "rule's pick / best"}).reset_index(drop=True),
        top=10, figure="block-k-rule", page="cta_latency", digits=2,
        note=f"The load points the rule gets wrong ({len(wrong)} of {len(dec)} decisive), worst first.")

# %% [markdown]
# ## Where the best split lands, and the one-wave split rule
#
# For every shape at the default tile: the CTAs of its measured best split against the CTAs of its unsplit launch.
# The one-wave rule takes the largest power-of-two split whose CTAs still fit on the SMs (at least 1); it
# *predicts* a shape when its split (as measured) is within the tie tolerance of the best.

# %%
rows = []
for kernel in todo:
    kd = ok[ok["kernel"] == kernel]
    for _fam, g in kd.groupby(family_cols, dropna=False):
        g = default_tile(g, ("num_splits",))
        for _shape, s in g.groupby(shape_cols, dropna=False):
            if s["num_splits"].nunique() < 2:
                continue
            best = s.loc[s["p50_us"].idxmin()]
            c0 = float(best["ctas"]) / float(best["num_splits"])
            sm = int(best["sm_count"]) if pd.notna(best["sm_count"]) else info.sm_count
            measured = sorted(int(x) for x in s["num_splits"].unique())
            fit = [x for x in measured if x * c0 <= sm and (x & (x - 1)) == 0] or [measured[0]]
            pick = max(fit)
            t_pick = float(s[s["num_splits"] == pick]["p50_us"].min())
            rows.append(dict(kernel=kernel, family=family_label(best), batch=best["batch"], ctx_len=best["ctx_len"],
                             c0=c0, best_splits=int(best["num_splits"]), best_ctas=float(best["ctas"]),
                             rule_splits=pick, rule_regret=t_pick / float(best["p50_us"]), sm_count=sm))
splits_rule = pd.DataFrame(rows)
if splits_rule.empty:
    display(Markdown("No shape with two or more split counts measured."))
else:
    splits_rule["predicted"] = splits_rule["rule_regret"] <= 1 + tol
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    looks = plots.series_styles(sorted(splits_rule["kernel"].unique()))
    for kernel, g in splits_rule.groupby("kernel"):
        ax.scatter(g["c0"], g["best_ctas"], s=20, label=f"{kernel} ({len(g)} shapes)", alpha=0.8, **looks[kernel])
    lim = max(splits_rule["best_ctas"].max(), splits_rule["c0"].max()) * 1.5
    ax.plot([1, lim], [1, lim], color="#999999", lw=0.8, label="unsplit")
    plots.log2_axis(ax, "both")
    ax.set_xlabel("CTAs of the unsplit launch (log2)")
    ax.set_ylabel("CTAs at the best split (log2)")
    plots.mark_sm_multiples(ax, int(splits_rule["sm_count"].iloc[0]), axis="y")
    plots.legend_outside(ax)
    plots.title(fig, "Where the best split lands: CTAs at the measured optimum", info)
    notebook.show_figure(fig, "best-split-ctas", splits_rule)
    t = splits_rule.groupby("kernel").agg(shapes=("predicted", "size"), predicted=("predicted", "sum"),
                                          geomean_regret=("rule_regret", analysis.geomean),
                                          worst_regret=("rule_regret", "max"))
    notebook.show_table(t, note="One-wave split rule per kernel (predicted: within the tie tolerance of the best "
                                "split).")

# %%
parts = []
if bk_summary:
    parts.append(f"BLOCK_K 32 once CTAs > SMs ({bk_summary['sm_count']}) predicts {bk_summary['predicted']} of "
                 f"{bk_summary['decisive']} decisive load points ({bk_summary['points'] - bk_summary['decisive']} "
                 f"ties within {tol:.0%}); in hindsight {bk_summary['hindsight']}")
else:
    parts.append("no load point has both BLOCK_K values measured")
if not splits_rule.empty:
    parts.append(f"the one-wave split rule is within {tol:.0%} of the best split on "
                 f"{int(splits_rule['predicted'].sum())} of {len(splits_rule)} shapes")
notebook.record_finding(("MODELLED: " if info.fake else "") + "; ".join(parts) + f" ({info.device}, {info.date}).",
                        block_k=bk_summary, split_rule_shapes=len(splits_rule),
                        split_rule_predicted=int(splits_rule["predicted"].sum()) if len(splits_rule) else 0)
