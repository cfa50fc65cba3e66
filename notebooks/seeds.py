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
# # The seeds, reproduced and measured on the H200
#
# splitlab starts from three published rules. Each is ported as a pure function (`splitlab.planners`); here each
# seed's own claims are checked against the port, and then the rule is measured on the H200 analogue: splitlab's
# Triton kernels on the H200, against the best split (or tile) measured for the same shape.
#
# | seed | system | rule |
# |---|---|---|
# | 000 | Modular MAX `hip_mha_decoding_num_partitions` | MI355X MHA + MLA decode split-K: wave-aligned partitions |
# | 001 | FlashInfer `cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits` | sparse-MLA splits on RTX PRO 6000/5090, GB10 |
# | 003 | aiter `pa_decode_sparse` | `BLOCK_K = 32 if ctas > num_sms else 64` on gfx950 |
#
# The first three parts need no measurements. The last uses the data when they hold the seeds' shapes (the
# cards' `seed` grids), and says so plainly when they do not.

# %% tags=["parameters"]
data: str = "h200"  # result set: a catalog name (data/catalog.toml) or a folder of sweeps; h200: the current set
allow_fake: bool = False  # accept modelled rows (the fake timer); every figure then says MODELLED
tol: float = 0.01  # two p50s within this relative distance are a tie

# %%
import warnings
from math import ceil

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from splitlab import analysis, datasets, devices, notebook, plots
from splitlab.errors import SplitlabError
from splitlab.planners import aiter, flashinfer, modular
from splitlab.planners import splitlab as splitlab_rule

PAGE = "seeds"  # the report's name for this page (its CSV files start with it)
plots.setup()
notebook.show_whole_tables()
warnings.filterwarnings("ignore", category=UserWarning)
claims: list[dict] = []  # the reproduced claims, one line each
measured: list[dict] = []  # each rule measured on the H200, one line each

# %% [markdown]
# ## The seeds' claims, reproduced by the ports
#
# **Seed 000** (Modular, MI355X, 256 CUs, MLA at 64 heads): MLA packs BM = 32 query heads per CTA, so a partition
# launches `ceil(64 / 32) x batch` CTAs; the rule takes `np = clamp(ceil(pages / 5), one_wave, two_wave)` with pages
# of 256 keys, `one_wave = 256 // ctas`, `two_wave = 512 // ctas`, caps at 256 and rounds up the bucket ladder 1, 2,
# 4, 8, 16, 32, 48, 64, 96, 128, 192, 256 (the seed's contexts 65K, 80K and 131K read as 65536, 81920 and 131072).
# Its exception, MLA with 16 or fewer heads targeting two full waves ("5-10 % faster", measured on the MI355X), is
# not checkable here; the port's picks are folded below. **Seed 001** (FlashInfer's cake sparse-MLA rules): the grid
# is counted in CTAs of 16 x `head_tiles` heads, a chunk is 64 candidates; each rule of the seed's docstring with a
# worked example (the GB10 values stated in the seed, the others following from its rules) against `plan_splits`
# (head_tiles = 1). **Seed 003** (aiter, gfx950): 64 heads (4 head blocks of 16), head dim 512, top-k 2048;
# `num_splits` from aiter's cost model `_decode_num_splits`, then `ctas = num_queries x num_splits x 4` and
# `BLOCK_K = 32 if ctas > 256 else 64`: the switch tracks CTAs, not queries (32 queries launch fewer CTAs than 24
# or 34).

# %%
PHASE0 = [  # (batch, keys, np the seed states, the seed's reason)
    (1, 131072, 128, "capped, fills GPU at 1-wave + cap"),
    (2, 65536, 64, "one_wave=64 dominates"),
    (2, 81920, 64, "one_wave=64 dominates; work_floor 64 capped"),
    (2, 131072, 128, "work_floor=103 -> bucket to 128"),
    (8, 81920, 32, "work_floor 64 capped by two_wave=32"),
    (8, 131072, 32, "work_floor 103 capped by two_wave=32"),
    (16, 131072, 16, "work_floor 103 capped by two_wave=16"),
]
rows = []
for bs, nk, want, why in PHASE0:
    ctas = ceil(64 / modular.BM) * bs
    pages = ceil(nk / modular.SPLIT_PAGE_SIZE)
    got = modular.hip_mha_decoding_num_partitions(bs, nk, 64, 256, is_mla=True)
    rows.append(dict(batch=bs, keys=nk, ctas_per_partition=ctas, pages=pages, one_wave=256 // ctas,
                     two_wave=512 // ctas, work_floor=ceil(pages / modular.MAX_PAGES_PER_SPLIT), seed_np=want,
                     port_np=got, match=got == want, seed_reason=why))
phase0 = pd.DataFrame(rows)
exc = pd.DataFrame([dict(heads=h, batch=bs, keys=nk,
                         np=modular.hip_mha_decoding_num_partitions(bs, nk, h, 256, is_mla=True))
                    for h in (16, 64) for bs in (1, 4, 8, 16) for nk in (32768, 131072)])
claims.append(dict(seed="000", claim="Phase 0 table: hip_mha_decoding_num_partitions(batch, keys, 64, 256, "
                   "is_mla=True)", reproduced=f"{int(phase0['match'].sum())} of {len(phase0)} rows"))

PRO, R5090, GB10 = 188, 170, 48
EXAMPLES = [  # (rule, device, sms, tokens, heads, topk, the rule's splits)
    ("two chunks never split", "RTX PRO 6000", PRO, 1, 16, 128, 1),
    ("grid <= 40 % of SMs: largest pow2 split within 80 % of SMs, >= 2 chunks per CTA", "RTX PRO 6000", PRO, 9, 16,
     2048, 16),
    ("... the same on the smaller RTX 5090: 9 x 16 = 144 CTAs > 136 = 80 % of 170", "RTX 5090", R5090, 9, 16, 2048, 8),
    ("... one chunk per CTA only for a lone CTA", "RTX PRO 6000", PRO, 1, 16, 512, 8),
    ("full grid, 16 chunks, doubled grid's last wave >= half full: split in two", "RTX PRO 6000", PRO, 188, 16, 1024,
     2),
    ("full grid, 16 chunks, doubled grid's last wave < half full: unsplit", "RTX PRO 6000", PRO, 200, 16, 1024, 1),
    ("full grid with 15 chunks: unsplit", "RTX PRO 6000", PRO, 188, 16, 960, 1),
    ("everything else (between 40 % and a full grid) runs unsplit", "RTX PRO 6000", PRO, 100, 16, 1024, 1),
    ("> 1024 candidates force splits >= ceil(chunks / 16)", "RTX PRO 6000", PRO, 64, 128, 2048, 2),
    ("... 4096 candidates: 64 chunks -> 4", "RTX PRO 6000", PRO, 64, 128, 4096, 4),
    ("GB10: one token, 128 heads (8 CTAs) is best at two splits", "GB10", GB10, 1, 128, 512, 2),
    ("GB10: one token, <= 64 heads at four", "GB10", GB10, 1, 64, 512, 4),
    ("GB10: eight distinct tokens never gain from a split", "GB10", GB10, 8, 16, 512, 1),
    ("GB10: at least two chunks per CTA also for a lone CTA", "GB10", GB10, 1, 16, 512, 4),
    ("GB10: no wave-quantization split on a full grid", "GB10", GB10, 48, 16, 1024, 1),
]
rows = []
for rule, dev, sms, t, h, k, want in EXAMPLES:
    got, cpb = flashinfer.plan_splits(num_tokens=t, num_heads=h, topk=k, num_sms=sms)
    rows.append(dict(rule=rule, device=f"{dev} ({sms})", tokens=t, heads=h, topk=k, chunks=flashinfer.num_chunks(k),
                     rule_splits=want, port_splits=got, chunks_per_block=cpb, match=got == want))
try:
    flashinfer.plan_splits(num_tokens=1, num_heads=16, topk=2048, num_sms=PRO, max_splits=1)
    raised = "no error"
except ValueError as e:
    raised = f"ValueError: {e}"
ex001 = pd.DataFrame(rows)
claims.append(dict(seed="001", claim="cake's worked examples: plan_splits(num_tokens, num_heads, topk, num_sms)",
                   reproduced=f"{int(ex001['match'].sum())} of {len(ex001)} examples"))
claims.append(dict(seed="001", claim="max_splits below the forced minimum raises",
                   reproduced="yes" if raised.startswith("ValueError") else "no: " + raised))

nqs = [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 34, 40, 48, 56, 64, 80, 96, 112, 128]
rows = []
for dev in (devices.get("mi355x"), devices.get("h200")):
    for nq in nqs:
        s = aiter.decode_num_splits(nq, 4, 2048.0, 0.0, 64, num_sms=dev.sm_count)
        ctas = nq * s * 4
        rows.append(dict(device=dev.name, sms=dev.sm_count, num_queries=nq, num_splits=s, ctas=ctas,
                         block_k=aiter.pa_decode_sparse_block_k(ctas, dev.sm_count)))
s003 = pd.DataFrame(rows)
mono = s003[s003["device"] == "mi355x"].sort_values("ctas")
monotone = bool((mono["block_k"].diff().fillna(0) <= 0).all())
claims.append(dict(seed="003", claim="BLOCK_K switches on CTAs, not queries (pa_decode_sparse_block_k)",
                   reproduced="yes: monotone in CTAs, one switch at 256 CUs" if monotone else "no: not monotone"))
notebook.show_table(pd.DataFrame(claims))
notebook.show_table(phase0, folded="Seed 000: the Phase 0 table, row by row")
notebook.show_table(exc.pivot_table(index=["heads", "batch"], columns="keys", values="np"),
                    folded="Seed 000's few-head exception: the port's partitions at 16 and 64 heads")
notebook.show_table(ex001, folded=f"Seed 001: cake's examples, rule by rule (and: {raised})")
notebook.show_table(s003[s003["device"] == "mi355x"].set_index("num_queries")[["num_splits", "ctas", "block_k"]].T,
                    folded="Seed 003: aiter's split count, CTAs and BLOCK_K per query count (MI355X)")

# %%
fig, axes = plt.subplots(1, 3, figsize=plots.figsize(11.5, 3.1), sharey=True)
tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256]
cake_rows = []
for ax, (dev, sms) in zip(axes, (("RTX PRO 6000", PRO), ("RTX 5090", R5090), ("GB10", GB10)), strict=True):
    for heads, look in plots.series_styles((16, 64, 128)).items():
        s = [flashinfer.plan_splits(num_tokens=t, num_heads=heads, topk=2048, num_sms=sms)[0] for t in tokens]
        ax.plot(tokens, s, ms=4.5, label=f"{heads} heads", **look)
        cake_rows += [dict(device=dev, sms=sms, heads=heads, topk=2048, tokens=t, splits=x)
                      for t, x in zip(tokens, s, strict=True)]
    plots.log2_axis(ax, "both")
    ax.set_xlabel("query tokens (log2)")
    ax.set_title(f"{dev} ({sms} SMs)")
axes[0].set_ylabel("splits (top-k 2048)")
plots.legend_outside(axes[-1])
plots.title(fig, "Seed 001: cake's split count against tokens", device="rule text, head_tiles = 1")
notebook.show_figure(fig, "seed001-cake", pd.DataFrame(cake_rows))

fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.0))
for ax, dev in zip(axes, ("mi355x", "h200-sxm"), strict=True):
    g = s003[s003["device"] == dev]
    ax.plot(g["num_queries"], g["ctas"], color="#999999", lw=0.8)
    for bk, color in ((64, "#1f77b4"), (32, "#ff7f0e")):
        h = g[g["block_k"] == bk]
        ax.scatter(h["num_queries"], h["ctas"], color=color, s=22, label=f"BLOCK_K {bk}", zorder=3)
    plots.log2_axis(ax, "both")
    ax.set_xlabel("query tokens (log2)")
    ax.set_ylabel("CTAs at aiter's split (log2)")
    plots.mark_sm_multiples(ax, int(g["sms"].iloc[0]), axis="y")
    ax.set_title(f"{dev} ({int(g['sms'].iloc[0])} CUs/SMs)")
plots.legend_outside(axes[-1])
plots.title(fig, "Seed 003: CTAs and the rule's BLOCK_K against query count", device="mi355x and h200 (rule)")
notebook.show_figure(fig, "seed003-ctas", s003)

# %% [markdown]
# ## Each rule measured on the H200
#
# From here on the numbers come from the data: splitlab's kernels timed on the data's GPU, each rule's choice
# against the best point measured for the same shape (regret: p50 over that best p50). The transfer studies
# (`analysis.replay`: the rule asked for its plan per shape, the measured point with exactly those knobs looked up;
# a shape whose plan was not measured is left out) ask three questions of the seeds' rules: **000** for MLA with 16
# or 32 heads (a CTA holds all heads, so a split launches `batch` CTAs), two waves (`2 x SMs // batch` splits) or
# one (`SMs // batch`), both rounded down to a power of two, capped by 64 keys per split and 256 splits; **001**
# while the unsplit grid covers at most 40% of the SMs, the largest power-of-two split that keeps the grid within
# 80% of the SMs and at least two chunks (BLOCK_K tiles of the kernel's default, 64 candidates for 512-wide rows)
# per CTA; **003** "BLOCK_K 32 once CTAs exceed the SMs" beside "BLOCK_K 64 always", counted in load points (a
# shape at one split count with both BLOCK_K measured; within the tie tolerance, no side).

# %%
try:
    df, info = datasets.load_data(data, allow_fake=allow_fake)
    display(Markdown(datasets.describe(info, df)))
except SplitlabError as e:
    df, info = None, None
    display(Markdown(f"**No data:** {e}. The measured part is left out."))


def at_tile(g: pd.DataFrame, keep: tuple[str, ...] = ("num_splits",)) -> pd.DataFrame:
    """Rows at the most common value of every knob not in ``keep`` (the default tile)."""
    for k in analysis.KNOBS:
        if k in keep or k not in g.columns or g[k].isna().all():
            continue
        g = g[g[k] == g[k].mode().iloc[0]]
    return g


def t_of(s: pd.DataFrame, splits: int) -> float:
    """The p50 measured at ``splits`` in ``s`` (NaN when the grid did not measure that split count)."""
    v = s[s["num_splits"] == splits]["p50_us"]
    return float(v.min()) if len(v) else np.nan


def line(seed: str, what: str, shapes, result: str) -> None:
    measured.append(dict(seed=seed, measured=what, shapes=shapes, result=result))


def regret_text(r: pd.Series) -> str:
    r = r.dropna()
    return f"geomean regret {analysis.geomean(r):.3f}, worst {r.max():.2f}x" if len(r) else "not measured"


ok = analysis.measured(df, allow_fake=allow_fake) if df is not None else None
reg = analysis.regret(df, allow_fake=allow_fake) if df is not None else None
m000 = r001 = pd.DataFrame()
rule = pd.DataFrame()
if df is not None:  # seed 000: the Phase 0 shapes on mla_decode
    mla = ok[(ok["kernel"] == "mla_decode") & (ok["num_q_heads"] == 64)]
    rows = []
    for bs, nk, want, _ in PHASE0:
        s = at_tile(mla[(mla["batch"] == bs) & (mla["ctx_len"] == nk)])
        if s.empty:
            continue
        best = s.loc[s["p50_us"].idxmin()]
        sm = int(best["sm_count"]) if pd.notna(best["sm_count"]) else info.sm_count
        here = modular.hip_mha_decoding_num_partitions(bs, nk, 64, sm, is_mla=True)
        pl = s["planners"].fillna("").str.split(",")
        mine = s[pl.apply(lambda x: "modular" in x)]
        rows.append(dict(batch=bs, keys=nk, best_splits=int(best["num_splits"]), best_us=float(best["p50_us"]),
                         mi355x_np=want, regret_mi355x_np=t_of(s, want) / best["p50_us"],
                         h200_np=here, regret_h200_np=t_of(s, here) / best["p50_us"],
                         modular_h200=int(mine["num_splits"].iloc[0]) if len(mine) else np.nan,
                         regret_modular_h200=(float(mine["p50_us"].iloc[0]) / best["p50_us"]) if len(mine) else np.nan))
    m000 = pd.DataFrame(rows)
    if m000.empty:
        line("000", "Phase 0 shapes on mla_decode (64 heads)", 0, "not in the data (the mla_decode card's `seed` grid "
             "measures them)")
    else:
        line("000", "Phase 0 shapes, the HIP rule's MI355X partitions", len(m000),
             regret_text(m000["regret_mi355x_np"]))
        line("000", "Phase 0 shapes, the same rule at the H200's SMs", int(m000["regret_h200_np"].notna().sum()),
             regret_text(m000["regret_h200_np"]))
    for name in ("modular", "modular@mi355x"):
        for kernel, g in reg[reg["planner"] == name].groupby("kernel"):
            line("000", f"{name} on every {kernel} shape", int(g["regret"].notna().sum()), regret_text(g["regret"]))
    r001 = reg[(reg["kernel"] == "sparse_mla_decode") & reg["planner"].str.startswith("flashinfer")]
    twins = analysis.version_twins(df[df["kernel"] == "sparse_mla_decode"])
    merged = analysis.merged_versions(twins)
    r001 = r001[~r001["planner"].isin(list(merged))]  # a release that chose as the rule: shown once
    s001 = analysis.summary(r001) if len(r001) else pd.DataFrame()
    if r001.empty:
        line("001", "cake on sparse_mla_decode", 0, "no FlashInfer choice on sparse_mla_decode in the data")
    for p_ in s001[~s001["planner"].str.contains("@")].itertuples() if len(s001) else []:
        line("001", f"cake ({p_.planner}) on sparse_mla_decode", int(p_.measured),
             f"geomean regret {p_.geomean:.3f}, worst {p_.worst:.2f}x")
    if len(s001) and s001["planner"].str.contains("@").any():
        f = s001[s001["planner"].str.contains("@")].sort_values("geomean")
        line("001", "cake as it plans for " + ", ".join(x.split("@")[1] for x in f["planner"]) + ", on the H200",
             f"{int(f['measured'].min())}-{int(f['measured'].max())}",
             "geomean regret " + ", ".join(f"{g:.2f}" for g in f["geomean"]) + " (in that order)")
    sp = ok[ok["kernel"] == "sparse_mla_decode"]
    rule = analysis.cta_rule(sp, tol=tol) if len(sp) else pd.DataFrame()
    if rule.empty:
        line("003", "BLOCK_K rule on sparse_mla_decode", 0, "no load point with both BLOCK_K 32 and 64 measured")
    else:
        d_all = rule[rule["decisive"]]
        seed_shape = d_all[(d_all["num_q_heads"] == 64) & (d_all["topk"] == 2048)]
        line("003", f"'BLOCK_K 32 once CTAs > SMs' at {int(rule['sm_count'].iloc[0])} SMs, decisive load points",
             len(d_all), f"predicts {int(d_all['predicted'].sum())} ({len(rule) - len(d_all)} ties); at the seed's "
             f"shape (64 heads, top-k 2048) {int(seed_shape['predicted'].sum())} of {len(seed_shape)}; BLOCK_K 64 "
             f"always: {int((d_all['best'] == 64).sum())}")
    if reg["planner"].str.startswith("aiter").any():
        sa = analysis.summary(reg[reg["planner"].str.startswith("aiter")])
        for p_ in sa[sa["planner"] == "aiter"].itertuples():
            line("003", "the aiter planner (split count and BLOCK_K)", int(p_.measured),
                 f"geomean regret {p_.geomean:.3f}, worst {p_.worst:.2f}x")
        f = sa[sa["planner"].str.contains("@")].sort_values("geomean")
        if len(f):
            line("003", "aiter as it plans for " + ", ".join(x.split("@")[1] for x in f["planner"]) + ", on the H200",
                 f"{int(f['measured'].min())}-{int(f['measured'].max())}",
                 "geomean regret " + ", ".join(f"{g:.2f}" for g in f["geomean"]) + " (in that order)")


# %%
def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _waves_rule(n_waves: int):
    def rule(w, dev):
        from splitlab.planners.registry import Plan

        cap = min(splitlab_rule.MAX_SPLITS["mla"], ceil(w.keys_per_request / splitlab_rule.MIN_KEYS_PER_SPLIT["mla"]))
        return Plan(f"{n_waves}-wave", min(cap, _pow2_floor(n_waves * dev.sm_count // w.batch)))
    return rule


def _cake_rule(w, dev):
    from splitlab import waves
    from splitlab.kernels.sparse_mla import sparse_block_k
    from splitlab.planners.registry import Plan

    c0 = waves.ctas(w, 1)
    chunks = ceil(w.topk / sparse_block_k(w.head_dim_qk, w.dtype))
    s = 1
    while c0 * s * 2 <= 0.8 * dev.sm_count and chunks // (s * 2) >= 2:
        s *= 2
    return Plan("cake-80%", s)


w2 = cake = pd.DataFrame()
mla_few = ok[(ok["kernel"] == "mla_decode") & ok["num_q_heads"].isin([16, 32])] if df is not None else None
if mla_few is None or mla_few.empty:
    line("000", "transfer: two waves or one, MLA 16/32 heads", 0, "no MLA shape with 16 or 32 heads in the data")
else:
    one = analysis.replay(mla_few, _waves_rule(1), name="one wave", allow_fake=allow_fake)
    two = analysis.replay(mla_few, _waves_rule(2), name="two waves", allow_fake=allow_fake)
    keys = [c for c in analysis.shape_cols(one) if c in two.columns]  # every shape column: ragged batches apart
    w2 = one[keys + ["num_splits", "p50_us", "regret"]].merge(
        two[keys + ["num_splits", "p50_us", "regret"]], on=keys, suffixes=("_1w", "_2w"))
    w2 = w2[(w2["num_splits_1w"] != w2["num_splits_2w"])].dropna(subset=["p50_us_1w", "p50_us_2w"])
    if w2.empty:
        line("000", "transfer: two waves or one, MLA 16/32 heads", 0, "no shape has both split counts measured")
    else:
        w2["one_over_two"] = w2["p50_us_1w"] / w2["p50_us_2w"]
        wins, loses = int((w2["one_over_two"] > 1 + tol).sum()), int((w2["one_over_two"] < 1 - tol).sum())
        line("000", "transfer: two waves or one, MLA 16/32 heads (shapes where they differ)", len(w2),
             f"two waves faster on {wins}, slower on {loses}; one-wave / two-wave time geomean "
             f"{analysis.geomean(w2['one_over_two']):.2f}x ({w2['one_over_two'].min():.2f}-"
             f"{w2['one_over_two'].max():.2f}); regret one wave {analysis.geomean(w2['regret_1w']):.3f}, two "
             f"{analysis.geomean(w2['regret_2w']):.3f}")

sp_all = ok[ok["kernel"] == "sparse_mla_decode"] if df is not None else None
if sp_all is None or sp_all.empty:
    line("001", "transfer: the 80%-grid / two-chunk split", 0, "no sparse_mla_decode shape in the data")
else:
    from splitlab import results as _results
    from splitlab import waves as _waves

    sm = int(sp_all["sm_count"].dropna().iloc[0]) if sp_all["sm_count"].notna().any() else 132
    small = sp_all[[_waves.ctas(_results.workload(r), 1) <= 0.4 * sm for _, r in sp_all.iterrows()]]
    if small.empty:
        line("001", "transfer: the 80%-grid / two-chunk split", 0, "no unsplit grid within 40% of the SMs")
    else:
        cake = analysis.replay(small, _cake_rule, name="cake 80%", allow_fake=allow_fake)
        r = cake["regret"].dropna()
        hit = int((cake["num_splits"] == cake["oracle_splits"]).sum())
        line("001", "transfer: the 80%-grid / two-chunk split (unsplit grid within 40% of the SMs)", len(r),
             f"the measured best split on {hit}; {regret_text(r)}")
if measured:
    notebook.show_table(pd.DataFrame(measured), note="Regret: p50 of the rule's pick over the best p50 measured for "
                        "the shape, on splitlab's kernels.")
if len(m000):
    notebook.show_table(m000, folded="Seed 000: the Phase 0 shapes on the H200, shape by shape")
if len(r001):
    notebook.show_table(s001, folded="Seed 001: cake as it plans for each device, measured on the H200"
                        + (f" ({'; '.join(merged.values())})" if merged else ""))
if reg is not None and reg["planner"].str.startswith("aiter").any():
    notebook.show_table(analysis.summary(reg[reg["planner"].str.startswith("aiter")]),
                        folded="Seed 003: the aiter planner as it plans for each device, measured on the H200")
if len(w2):
    notebook.show_table(w2.assign(_d=(np.log(w2["one_over_two"])).abs()).sort_values("_d", ascending=False)
                        .drop(columns="_d").reset_index(drop=True), top=10, name="seed000-waves", page=PAGE,
                        folded="Seed 000 transfer: the shapes where one wave and two differ most", note="One row per "
                        "shape (ragged batches by distribution and seed); `one_over_two`: one-wave time / two-wave.")
if len(cake):
    notebook.show_table(cake[[c for c in ("num_q_heads", "batch", "topk", "length_dist", "length_seed", "num_splits",
                                          "oracle_splits", "regret") if c in cake.columns]]
                        .sort_values("regret", ascending=False).reset_index(drop=True), top=10,
                        name="seed001-cake80", page=PAGE, folded="Seed 001 transfer: the shapes where the 80%-grid "
                        "split loses most")

# %%
if len(m000):
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    x = np.arange(len(m000))
    for k, (col, label, color) in enumerate((("regret_mi355x_np", "HIP rule @ MI355X (256 CUs)", "#1f77b4"),
                                             ("regret_h200_np", "HIP rule @ H200 SMs", "#17becf"),
                                             ("regret_modular_h200", "modular on H200 (1 split)", "#7f7f7f"))):
        ax.bar(x + (k - 1) * 0.27, m000[col].fillna(0), width=0.27, color=color, label=label)
        for xi in x[m000[col].isna().to_numpy()]:
            ax.text(xi + (k - 1) * 0.27, 1.0, "not\nmeasured", rotation=90, fontsize=plots.MIN_FONT_PT, ha="center",
                    va="bottom")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, [f"B{b}\n{plots.fmt_pow2(n)}" for b, n in zip(m000["batch"], m000["keys"], strict=True)])
    ax.set_yscale("log", base=2)
    ax.set_ylim(bottom=0.8)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:g}x"))
    ax.set_ylabel("regret (p50 / best)")
    plots.legend_outside(ax)
    plots.title(fig, "Seed 000 on the H200: Phase 0 shapes, mla_decode at 64 heads", info)
    notebook.show_figure(fig, "seed000-h200", m000)
if len(r001):
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    plots.ecdf(ax, {p: r001.loc[r001["planner"] == p, "regret"] for p in r001["planner"].unique()})
    plots.legend_outside(ax)
    plots.title(fig, "Seed 001 on the H200: regret of cake's choices (sparse_mla_decode)", info)
    notebook.show_figure(fig, "seed001-h200", r001.reset_index(drop=True))
if not rule.empty:
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    looks = plots.series_styles(sorted(rule["num_q_heads"].unique()))
    for heads, g in rule.groupby("num_q_heads"):
        ax.scatter(g["ctas"], g["gain_small"], s=18, label=f"{heads} heads", **looks[heads])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(1 - tol, 1 + tol, color="#dddddd", alpha=0.6, lw=0)
    plots.log2_axis(ax, "x", label="CTAs of the partial launch (log2)")
    ax.set_ylabel("p50@64 / p50@32")
    plots.mark_sm_multiples(ax, int(rule["sm_count"].iloc[0]))
    plots.legend_outside(ax)
    plots.title(fig, "Seed 003 on the H200: gain of BLOCK_K 32 against CTAs", info)
    notebook.show_figure(fig, "seed003-h200", rule.reset_index(drop=True))

# %%
reproduced = bool(phase0["match"].all() and ex001["match"].all() and raised.startswith("ValueError") and monotone)
text = ("The ports reproduce every checked claim of the three seeds" if reproduced else
        "The ports do not reproduce every checked claim: " + "; ".join(f"{c['seed']} {c['reproduced']}"
                                                                        for c in claims))
if df is None:
    text += "; not measured: no data"
else:
    parts = []
    if len(m000):
        parts.append(f"seed 000's MI355X partitions are {analysis.geomean(m000['regret_mi355x_np']):.2f}x off the best "
                     f"on its Phase 0 shapes")
    if len(w2):
        parts.append(f"two waves beat one on {int((w2['one_over_two'] > 1 + tol).sum())} of {len(w2)} few-head MLA "
                     "shapes")
    own = s001[s001["planner"] == "flashinfer"] if len(s001) else s001
    if len(own):
        parts.append(f"cake's splits are {own['geomean'].iloc[0]:.2f}x off in geomean on sparse MLA")
    if not rule.empty:
        d_all = rule[rule["decisive"]]
        parts.append(f"seed 003's BLOCK_K switch is right on {int(d_all['predicted'].sum())} of {len(d_all)} load "
                     f"points, BLOCK_K 64 always on {int((d_all['best'] == 64).sum())}")
    text += "; on " + info.device + (" (MODELLED)" if info.fake else "") + ": " + "; ".join(parts)
notebook.record_finding(("MODELLED: " if info is not None and info.fake else "") + text + ".",
                        phase0_reproduced=int(phase0["match"].sum()),
                        cake_examples_reproduced=int(ex001["match"].sum()))
