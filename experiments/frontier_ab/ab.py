"""The A/B behind this folder's CSVs (README.md): ``python experiments/frontier_ab/ab.py OUT.jsonl {mqa,gqa,tiles}``
from the repository root, on one GPU. One JSON row per (variant, shape, split count); a variant that fails is a row
with ``error``."""

import json
import sys
import time

import torch

from splitlab.bench.peers import contiguous_kv, sdpa
from splitlab.bench.timing import rotations, time_graph
from splitlab.kernels.accuracy import rel_err
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs

D = 128
MAX_SETS = 16


def floor_us(batch: int, hq: int, hkv: int, n: int) -> float:
    """The roofline floor: max(unique K/V bytes / 4.5 TB/s, FLOPs / 790 TFLOP/s), in us."""
    return max(batch * hkv * n * D * 2 * 2 / 4.5e12, 4 * batch * hq * n * D / 790e12) * 1e6


def sets_for(read_bytes: int) -> int:
    return max(1, min(rotations(read_bytes, torch.cuda.get_device_properties(0).L2_cache_size), MAX_SETS))


def emit(path: str, **row) -> None:
    print(json.dumps(row), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def bench_paged(path, part, batch, hq, hkv, n, page, splits, variants) -> None:
    """splitlab's paged kernel: each (name, kv-head expansion, knobs) variant at each split count. An expansion
    e > 1 passes the cache as e kv heads of stride 0 (a head split: each program takes hq / (hkv * e) rows)."""
    ins = [gqa_inputs(batch, hq, hkv, D, n, page_size=page, device="cuda", seed=i, draw_on="device")
           for i in range(sets_for(batch * hkv * n * D * 4))]
    ref = None
    for name, expand, knobs in variants:
        for s in splits:
            def make(x, s=s, expand=expand, knobs=knobs):
                k, v = x["k_cache"], x["v_cache"]
                if expand > 1:
                    k, v = k.expand(-1, -1, expand, -1), v.expand(-1, -1, expand, -1)
                return lambda: gqa_decode(x["q"], k, v, x["block_table"], x["seq_lens"], num_splits=s, **knobs)
            row = dict(part=part, impl=name, B=batch, hq=hq, hkv=hkv, n=n, page=page, s=s)
            try:
                out = make(ins[0])()
                torch.cuda.synchronize()
                ref = out.float() if ref is None else ref
                t = time_graph([make(x) for x in ins], replays=20)
                emit(path, **row, us=t.p50_us, err=rel_err(out, ref), roof=floor_us(batch, hq, hkv, n) / t.p50_us,
                     sets=len(ins))
            except Exception as e:  # a tile the GPU refuses: recorded, not timed
                emit(path, **row, error=str(e)[:200])
    del ins
    torch.cuda.empty_cache()


def bench_sdpa(path, part, batch, hq, hkv, n) -> None:
    """SDPA's cuDNN and flash backends on a contiguous cache of the same shape."""
    for backend in ("cudnn", "flash"):
        row = dict(part=part, impl="sdpa-" + backend, B=batch, hq=hq, hkv=hkv, n=n)
        try:
            ins = [contiguous_kv(batch, hq, hkv, D, n, seed=i) for i in range(sets_for(batch * hkv * n * D * 4))]
            t = time_graph([sdpa(backend, *x) for x in ins], replays=20)
            emit(path, **row, us=t.p50_us, roof=floor_us(batch, hq, hkv, n) / t.p50_us)
            del ins
            torch.cuda.empty_cache()
        except Exception as e:
            emit(path, **row, error=str(e)[:200])


def main(path: str, part: str) -> None:
    t0 = time.time()
    if part == "mqa":
        variants = [("native", 1, {}), ("split2", 2, {}), ("split2w8", 2, dict(num_warps=8)), ("split4", 4, {})]
        for batch, n in [(8, 8192), (8, 65536), (16, 8192), (16, 32768), (32, 8192), (32, 65536), (64, 8192),
                         (64, 32768), (128, 16384)]:
            splits = sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32} | {max(1, 132 // batch), max(1, 264 // batch)})
            splits = [s for s in splits if batch * s <= 1200 and n // s >= 256]
            bench_paged(path, part, batch, 128, 1, n, 16, splits, variants)
            bench_sdpa(path, part, batch, 128, 1, n)
            print("elapsed", time.time() - t0, flush=True)
    elif part in ("gqa", "tiles"):
        tiles = [(64, 4, 3)] if part == "gqa" else [
            (64, 4, 3), (64, 4, 2), (64, 4, 4), (32, 4, 3), (32, 4, 2), (32, 2, 3), (128, 4, 2), (128, 8, 3),
            (64, 8, 3), (16, 4, 4)]
        variants = [("native" if part == "gqa" else f"bn{bn}w{w}s{st}", 1,
                     {} if part == "gqa" else dict(block_n=bn, num_warps=w, num_stages=st)) for bn, w, st in tiles]
        heads = [(32, 8), (40, 8), (64, 8)] if part == "gqa" else [(32, 8), (64, 8)]
        shapes = ([(1, 8192), (4, 65536), (16, 1024), (16, 8192), (64, 1024), (64, 8192)] if part == "gqa" else
                  [(16, 1024), (64, 1024), (16, 8192), (64, 8192), (4, 65536), (1, 8192)])
        for hq, hkv in heads:
            for batch, n in shapes:
                splits = [s for s in (1, 2, 3, 4, 6, 8, 16, 32) if n // s >= 256 and batch * hkv * s <= 1600]
                for page in (16, 64):
                    bench_paged(path, part, batch, hq, hkv, n, page, splits, variants)
                bench_sdpa(path, part, batch, hq, hkv, n)
                print("elapsed", time.time() - t0, flush=True)
    else:
        raise SystemExit(f"part {part!r}: expected mqa, gqa or tiles")


if __name__ == "__main__":
    main(*sys.argv[1:3])
