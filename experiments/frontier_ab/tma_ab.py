"""TMA A/B (README.md): three experimental kernels against the shipped GQA kernel, beside SDPA:
``python experiments/frontier_ab/tma_ab.py OUT.jsonl CHECK.jsonl {gqa,mqa,ws}`` on one GPU;
``python experiments/frontier_ab/tma_ab.py summary OUT.jsonl CHECK.jsonl`` prints the reading (no GPU).

First an fp64 check of every variant on ragged batches whose unread slots and pages hold NaN (``CHECK.jsonl``),
then the timings through ``layout_ab.bench_paged`` at every split listed.
- ``gqa``: ``gqa_tma.py`` (K/V tiles as TMA boxes of one page, Triton's pipelined loop; at page 64 also with each
  box split over the warps) and ``gqa_wsplit.py`` (a tile's keys split over the warps) on the layout A/B's shapes
  (GQA 32/8 and 64/8, NHD pages 16 and 64);
- ``mqa``: ``gqa_tma.py`` on MQA-128 at batch 8-64 and 8K-64K keys (the roofline goal's shapes);
- ``ws``: ``gqa_ws_gluon.py`` (the boxes from a copy warp of their own) on ``gqa``'s shapes, a part of its own so
  that a hang in it costs only itself."""

import json
import sys
import time

import numpy as np
import pandas as pd
import torch
from ab import emit
from gqa_tma import gqa_tma
from gqa_ws_gluon import gqa_ws
from gqa_wsplit import gqa_wsplit
from layout_ab import HEADS, SHAPES, bench_paged, bench_sdpa, shape_setup

from splitlab.kernels import reference
from splitlab.kernels.accuracy import rel_err
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs, poison_unread_pages_

SHIPPED = [("shipped", gqa_decode, {}), ("shipped-s2", gqa_decode, dict(num_stages=2))]
WSPLIT = [(f"wsplit-bn{n}w{w}s{s}", gqa_wsplit, dict(block_n=n, num_warps=w, num_stages=s))
          for n, w, s in ((16, 4, 3), (16, 4, 4), (16, 2, 4), (16, 8, 3))]
WSPLIT.append(("wsplit-bn16w4s3r168", gqa_wsplit, dict(block_n=16, num_warps=4, num_stages=3, maxnreg=168)))
#: part -> page size -> variants (name, launcher, knobs); "shipped" first (the error column is against it).
VARIANTS = {
    "gqa": {16: SHIPPED + [(f"tma-bn16w{w}s{s}", gqa_tma, dict(block_n=16, num_warps=w, num_stages=s))
                           for w, s in ((4, 4), (4, 8), (4, 12), (2, 8), (2, 12), (1, 8))] + WSPLIT,
            64: SHIPPED + [(f"tma-bn64w4s{s}", gqa_tma, dict(block_n=64, num_stages=s)) for s in (2, 3, 4)]
            + [(f"tma-bn32w4s{s}", gqa_tma, dict(block_n=32, num_stages=s)) for s in (4, 6)] + WSPLIT
            + [(f"tma-wsplit-bn{n}w{w}s{s}", gqa_tma, dict(block_n=n, num_warps=w, num_stages=s, wsplit=True))
               for n, w, s in ((64, 4, 3), (64, 4, 4), (32, 2, 6))]},
    "ws": {16: SHIPPED[:1] + [(f"ws-bn16s{s}r{r}", gqa_ws, dict(block_n=16, num_stages=s, maxnreg=r))
                              for s, r in ((8, 80), (12, 128))],
           64: SHIPPED[:1] + [(f"ws-bn{n}s{s}r{r}", gqa_ws, dict(block_n=n, num_stages=s, maxnreg=r))
                              for n, s, r in ((64, 2, 80), (64, 3, 128), (32, 6, 128))]},
    "mqa": {16: SHIPPED[:1] + [(f"tma-bn16w8s{s}", gqa_tma, dict(block_n=16, num_stages=s, num_warps=8))
                               for s in (4, 8)],
            64: SHIPPED[:1] + [(f"tma-bn64w8s{s}", gqa_tma, dict(block_n=64, num_stages=s, num_warps=8))
                               for s in (2, 3)]},
}
MQA_SHAPES = [(8, 8192), (8, 65536), (16, 32768), (32, 8192), (64, 8192), (64, 32768)]
GQA_CHECKS = [(32, 8, [0, 1, 63, 64, 65, 1000, 4099, 517]), (40, 8, [5000, 17, 2048]), (64, 8, [129, 0, 3333])]
CHECKS = {"gqa": GQA_CHECKS, "ws": GQA_CHECKS, "mqa": [(128, 1, [0, 1, 65, 3000, 8191]), (96, 1, [777, 2049])]}


def check(path: str, part: str) -> None:
    """Every variant against the fp64 reference at split counts 1, 2 and 5: ragged lengths (an empty request,
    lengths off the tile and the page), NaN in every slot and page no request reads."""
    for page, variants in VARIANTS[part].items():
        for hq, hkv, lens in CHECKS[part]:
            x = gqa_inputs(len(lens), hq, hkv, 128, lens, page_size=page, device="cuda", seed=3)
            for c in ("k_cache", "v_cache"):
                poison_unread_pages_(x[c], x["block_table"], lens, page)
            ref = reference.gqa_decode(*(x[k].double() if x[k].is_floating_point() else x[k]
                                         for k in ("q", "k_cache", "v_cache", "block_table", "seq_lens")))
            for name, fn, knobs in variants:
                for s in (1, 2, 5):
                    out = fn(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], num_splits=s,
                             **knobs)
                    emit(path, impl=name, page=page, hq=hq, hkv=hkv, lens=lens, s=s, err=rel_err(out, ref),
                         nan=bool(torch.isnan(out).any()))


def main(path: str, check_path: str, part: str) -> None:
    if part not in VARIANTS:
        raise SystemExit(f"part {part!r}: expected one of {sorted(VARIANTS)}")
    t0 = time.time()
    check(check_path, part)
    if part in ("gqa", "ws"):
        cases = [(hq, hkv, batch, n) for hq, hkv in HEADS for batch, n in SHAPES]
    else:
        cases = [(128, 1, batch, n) for batch, n in MQA_SHAPES]
    for hq, hkv, batch, n in cases:
        planned, splits = shape_setup(batch, hq, hkv, n)
        for page, variants in VARIANTS[part].items():
            bench_paged(path, batch, hq, hkv, n, page, splits, planned,
                        [(name, "nhd", fn, knobs) for name, fn, knobs in variants])
        bench_sdpa(path, batch, hq, hkv, n)
        print("elapsed", time.time() - t0, flush=True)


def summary(path: str, check_path: str) -> None:
    """Per page size and variant: the worst fp64 error and any NaN; the speed against SDPA cuDNN (BHND) at each
    shape's fastest split and at the planner's split (geomean, worst shape); the roofline fraction (fastest split)."""
    pd.set_option("display.width", 200)
    chk = pd.DataFrame(map(json.loads, open(check_path)))
    print(chk.groupby(["hq", "page", "impl"]).agg(max_err=("err", "max"), nan=("nan", "any")).to_string())
    d = pd.DataFrame(map(json.loads, open(path)))
    ours, peer = d[~d.impl.str.startswith("sdpa")], d[d.impl.str.startswith("sdpa")]
    shape = ["hq", "hkv", "B", "n"]
    cudnn = peer[(peer.impl == "sdpa-cudnn") & (peer.layout == "bhnd")].set_index(shape).us
    rows = []
    for (page, impl), g in ours.groupby(["page", "impl"]):
        best = g.groupby(shape).us.min()
        planned = g[g.s == g.planned].groupby(shape).us.min()
        vs_best, vs_planned = cudnn.reindex(best.index) / best, cudnn.reindex(planned.index) / planned
        rows.append(dict(page=page, impl=impl, geomean_best=np.exp(np.log(vs_best).mean()), worst_best=vs_best.min(),
                         geomean_planned=np.exp(np.log(vs_planned).mean()), worst_planned=vs_planned.min(),
                         roofline_best=g.groupby(shape).roof.max().mean()))
    print("speed against SDPA cuDNN on BHND (measured, same run); roofline: mean over shapes")
    print(pd.DataFrame(rows).round(3).to_string(index=False))


if __name__ == "__main__":
    if sys.argv[1] == "summary":
        summary(*sys.argv[2:4])
    else:
        main(*sys.argv[1:4])
