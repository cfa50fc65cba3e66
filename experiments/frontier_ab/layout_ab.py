"""Cache layout A/B (README.md): splitlab's paged GQA decode on an NHD page ([pages, page, Hkv, D], the kv heads
interleaved every D values: ``gqa_inputs``) and on an HND page ([pages, Hkv, page, D] storage passed as its strided
[pages, page, Hkv, D] view), at three tiles, beside SDPA cuDNN and flash on BHND ([B, Hkv, N, D] contiguous) and
BNHD ([B, N, Hkv, D] viewed as BHND). ``python experiments/frontier_ab/layout_ab.py OUT.jsonl`` on one GPU."""

import sys
import time

import torch
from ab import D, emit, floor_us, sets_for

from splitlab.bench.peers import sdpa
from splitlab.bench.timing import time_graph
from splitlab.kernels._launch import launch_plan
from splitlab.kernels.accuracy import rel_err
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs
from splitlab.workloads import DecodeWorkload

HEADS = [(32, 8), (64, 8)]
SHAPES = [(1, 8192), (4, 65536), (16, 1024), (16, 8192), (64, 1024), (64, 8192), (8, 32768), (32, 4096)]
TILES = [("bn64w4s3", "nhd", gqa_decode, {}), ("bn64w4s3", "hnd", gqa_decode, {}),
         ("bn64w4s2", "nhd", gqa_decode, dict(num_stages=2)), ("bn64w4s2", "hnd", gqa_decode, dict(num_stages=2)),
         ("bn128w8s3", "hnd", gqa_decode, dict(block_n=128, num_warps=8))]


def hnd(t: torch.Tensor) -> torch.Tensor:
    """The same values stored as HND pages, viewed as [pages, page, Hkv, D]."""
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def shape_setup(batch: int, hq: int, hkv: int, n: int) -> tuple[int, list[int]]:
    """The planner's split at page 16 and the split counts timed: it, and 1-32 where a split keeps >= 256 keys."""
    w = DecodeWorkload(kind="gqa", batch=batch, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=D, head_dim_v=D,
                       ctx_len=n, page_size=16, dtype="bf16")
    planned = launch_plan(w, "h200").num_splits
    return planned, sorted({planned} | {s for s in (1, 2, 3, 4, 6, 8, 16, 32)
                                        if n // s >= 256 and batch * hkv * s <= 1600})


def bench_paged(path, batch, hq, hkv, n, page, splits, planned, variants) -> None:
    """Each (name, layout, launcher, knobs) variant at each split count on the shape's input sets (the launcher
    takes ``gqa_decode``'s arguments); ``err`` is against the first variant's output at the first split."""
    ins = [gqa_inputs(batch, hq, hkv, D, n, page_size=page, device="cuda", seed=i, draw_on="device")
           for i in range(sets_for(batch * hkv * n * D * 4))]
    lay = {"nhd": ins}
    if any(layout == "hnd" for _, layout, _, _ in variants):
        lay["hnd"] = [dict(x, k_cache=hnd(x["k_cache"]), v_cache=hnd(x["v_cache"])) for x in ins]
    ref = None
    for name, layout, fn, knobs in variants:
        for s in splits:
            def make(x, s=s, fn=fn, knobs=knobs):
                return lambda: fn(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                  num_splits=s, **knobs)
            row = dict(impl=name, layout=layout, B=batch, hq=hq, hkv=hkv, n=n, page=page, s=s, planned=planned)
            out = make(lay[layout][0])()
            torch.cuda.synchronize()
            ref = out.float() if ref is None else ref
            t = time_graph([make(x) for x in lay[layout]], replays=20)
            emit(path, **row, us=t.p50_us, err=rel_err(out, ref), nan=bool(torch.isnan(out).any()),
                 roof=floor_us(batch, hq, hkv, n) / t.p50_us, sets=len(ins))
    del ins, lay
    torch.cuda.empty_cache()


def bench_sdpa(path, batch, hq, hkv, n) -> None:
    """SDPA cuDNN and flash on a BHND cache and on a BNHD one viewed as BHND."""
    for backend in ("cudnn", "flash"):
        for layout in ("bhnd", "bnhd"):
            ins = []
            for i in range(sets_for(batch * hkv * n * D * 4)):
                g = torch.Generator(device="cuda").manual_seed(i)
                q = torch.randn(batch, hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
                shape = (batch, hkv, n, D) if layout == "bhnd" else (batch, n, hkv, D)
                k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
                ins.append((q, k, v) if layout == "bhnd" else (q, k.transpose(1, 2), v.transpose(1, 2)))
            t = time_graph([sdpa(backend, *x) for x in ins], replays=20)
            emit(path, impl="sdpa-" + backend, layout=layout, B=batch, hq=hq, hkv=hkv, n=n, us=t.p50_us,
                 roof=floor_us(batch, hq, hkv, n) / t.p50_us)
            del ins
            torch.cuda.empty_cache()


def main(path: str) -> None:
    t0 = time.time()
    for hq, hkv in HEADS:
        for batch, n in SHAPES:
            planned, splits = shape_setup(batch, hq, hkv, n)
            for page in (16, 64):
                bench_paged(path, batch, hq, hkv, n, page, splits, planned, TILES)
            bench_sdpa(path, batch, hq, hkv, n)
            print("elapsed", time.time() - t0, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
