"""Sparse MLA on schedules: the work-list kernel (``sparse_mla.sparse_mla_decode_scheduled``) against the split-count
kernel at its planner's default, on tokens of the same and of ragged valid top-k lengths, in one run (H200).

Per batch (DeepSeek-V4-style 64 heads at 512/512 and DeepSeek-V3.2's 128 heads at 576/512; 16, 64 and 128 query
tokens; top-k 2048 over a 64K-row pool; each token's valid top-k ``spread16``, ``longtail`` or the whole ``uniform``,
the rest of its row -1), every implementation is checked against the fp64 reference first (bf16 tolerance; a wrong
one is recorded and not timed), then timed by CUDA-graph replay over input sets rotated past the L2
(``bench.timing.time_graph``, partial kernel and merge together):

* ``splitlab-v6``: ``sparse_mla_decode`` at the planner's default (the Gluon tile where it is in scope);
* ``splitlab-v6-tl``: the same with the Gluon tile off (``mla_sm90.ENABLED``), the tl tile the work list runs;
* ``wl-uniform-topk``: the work list at the default's split count over the whole top-k (the split-count kernel's
  walk, item for item: what the work list itself costs);
* ``wl-uniform-v6``: the same split count over each token's valid prefix (what walking only it saves);
* ``wl-splitlab``: splitlab's scheduler; ``cand-*``: every candidate it weighs (balanced budgets) and stream-K at one
  and two waves (persistent), each over the valid prefixes.

Rows go to ``OUT/sparse_ab.csv`` (``ragged_ab.FIELDS``; ``longest`` is the top-k) as they are made; ``summary``
prints the ratios of the README.

    python experiments/schedules/sparse_ab.py run --out DIR [--budget-s 500] [--quick]
    python experiments/schedules/sparse_ab.py summary DIR/sparse_ab.csv
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ragged_ab import run_cases, worklist_impls

#: (label, model preset): the two sparse models of the card (64 heads at 512/512, 128 heads at 576/512).
SHAPES = (("v4-64", "deepseek-v4-sparse-mla"), ("v32-128", "deepseek-v3.2-sparse-mla"))
TOKENS, TOPK, POOL, DISTS = (16, 64, 128), 2048, 65536, ("spread16", "longtail", "uniform")


def workloads_for(quick: bool, seed_offset: int = 0, dists: tuple[str, ...] = DISTS):
    from splitlab import workloads

    for label, model in SHAPES:
        for t in TOKENS[:2] if quick else TOKENS:
            for dist in dists:
                if dist == "uniform" and t == 128:
                    continue
                w = workloads.get(model, batch=t, ctx_len=POOL, topk=TOPK)
                if dist != "uniform":
                    w = w.with_(length_dist=dist, length_seed=t + TOPK + seed_offset)
                yield label, dist, w


def tl_tile(fn):
    """``fn`` with the Gluon tile off while it runs (what a graph captures is then the tl tile's launch)."""
    from splitlab.kernels import mla_sm90

    def run():
        old, mla_sm90.ENABLED = mla_sm90.ENABLED, False
        try:
            return fn()
        finally:
            mla_sm90.ENABLED = old
    return run


def impls(w, dev, first):
    """(name, scheduler label, schedule or None, factory inputs -> callable) of every implementation timed."""
    from splitlab.bench import decode as bench_decode
    from splitlab.kernels import sparse_mla
    from splitlab.planners import schedulers as S

    knobs = bench_decode.default_knobs(w, dev)
    tiles = {k: v for k, v in knobs.items() if k != "num_splits"}
    dv = w.head_dim_v
    out = [("splitlab-v6", f"uniform:{knobs['num_splits']}", None,
            lambda x: (lambda: sparse_mla.sparse_mla_decode(**x, head_dim_v=dv, validate=False, **knobs))),
           ("splitlab-v6-tl", f"uniform:{knobs['num_splits']}", None,
            lambda x: tl_tile(lambda: sparse_mla.sparse_mla_decode(**x, head_dim_v=dv, validate=False, **knobs)))]
    n = knobs["num_splits"]
    scheds = {"wl-uniform-topk": S.uniform([w.topk] * w.batch, n, tile=tiles["block_k"], request_major=True),
              "wl-uniform-v6": S.uniform(list(w.lengths), n, tile=tiles["block_k"], request_major=True),
              "wl-splitlab": S.splitlab(w, dev)}

    def kernel(x, wl):
        return sparse_mla.sparse_mla_decode_scheduled(**x, work=wl, head_dim_v=dv, validate=False, **tiles)
    return out + worklist_impls(w, dev, first, scheds, kernel)


def run(args) -> None:
    from splitlab.kernels import reference

    def progress(w, dist, ok):
        best = min((v for k, v in ok.items() if k.startswith(("wl-", "cand-"))), default=None)
        return (f"T={w.batch} {dist}: v6 {ok.get('splitlab-v6')} v6-tl {ok.get('splitlab-v6-tl')} "
                f"wl-uniform-topk {ok.get('wl-uniform-topk')} wl-uniform-v6 {ok.get('wl-uniform-v6')} "
                f"wl-splitlab {ok.get('wl-splitlab')} best-sched {best}")

    run_cases(Path(args.out), "sparse_ab.csv", "env-sparse.json",
              workloads_for(args.quick, args.seed_offset, tuple(args.dists.split(","))), args.budget_s,
              family="sparse_mla", longest_of=lambda w: w.topk,
              reference_of=lambda w, first: reference.sparse_mla_decode(**first, head_dim_v=w.head_dim_v),
              impls_of=impls, progress=progress)


def summary(args) -> None:
    import pandas as pd

    df = pd.read_csv(args.csv)
    ok = df[df["status"] == "ok"]
    key = ["shape", "batch", "dist"]
    t = ok.pivot_table(index=key, columns="impl", values="us", aggfunc="min")
    t["best_sched"] = ok[ok["impl"].str.startswith(("wl-", "cand-"))].groupby(key)["us"].min()
    print(f"rows {len(df)}: ok {len(ok)}, wrong {(df.status == 'wrong').sum()}, error {(df.status == 'error').sum()}")

    def gm(x):
        x = x.dropna()
        return f"{math.exp(x.apply(math.log).mean()):.3f} ({x.min():.3f}-{x.max():.3f})" if len(x) else "-"

    # Time ratios (> 1: the first is slower), geomean (range) over the batches of each shape and distribution kind.
    pairs = [("wl-uniform-topk", "splitlab-v6-tl"), ("wl-uniform-v6", "splitlab-v6-tl"),
             ("wl-uniform-v6", "splitlab-v6"), ("wl-splitlab", "splitlab-v6"), ("best_sched", "splitlab-v6"),
             ("wl-splitlab", "best_sched")]
    for (shape, ragged), g in t.groupby([t.index.get_level_values("shape"),
                                         t.index.get_level_values("dist") != "uniform"]):
        print(f"{shape} {'ragged' if ragged else 'same top-k'} ({len(g)} batches):")
        for a, b in pairs:
            if a in g and b in g:
                print(f"  {a} / {b}: {gm(g[a] / g[b])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=500)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--seed-offset", type=int, default=0, help="added to every batch's length seed (fresh batches)")
    r.add_argument("--dists", default=",".join(DISTS), help="length distributions, comma-separated")
    s = sub.add_parser("summary")
    s.add_argument("csv")
    a = ap.parse_args(argv)
    {"run": run, "summary": summary}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
