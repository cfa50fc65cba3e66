"""Plan once, run every layer, on a GPU: what a call costs eager against its kernels replayed in a CUDA graph, and
one graph captured once replayed over many batches of new lengths (the capacity grid), checked against fp64.

    python experiments/plan_run/gpu.py --out OUT [--replays 100]

Writes OUT/plan_run_gpu.csv (one row per call kind and shape) and OUT/replays.csv (one row per replayed batch).
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from pathlib import Path

import torch

from splitlab.kernels import gqa, reference
from splitlab.kernels.accuracy import TOLERANCE, rel_err
from splitlab.kernels.decode_plan import GQADecodePlan
from splitlab.kernels.inputs import gqa_inputs

SHAPES = [(32, 8, 8, 4096), (32, 8, 64, 4096)]  # (query heads, kv heads, batch, keys): the GQA rows


def eager_us(fn, calls: int = 200) -> float:
    """Wall time per call of ``calls`` back-to-back eager calls (host and GPU together), after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def graph_us(fn, replays: int = 50) -> float:
    """Per replay of a graph holding one call (its kernels alone, no host work)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / replays * 1e3


def overhead(out: Path) -> None:
    write(out / "plan_run_gpu.csv", [row for shape in SHAPES for row in one_shape(*shape)])


def one_shape(hq: int, hkv: int, b: int, n: int) -> list[dict]:
    rows = []
    x = gqa_inputs(b, hq, hkv, 128, n, page_size=16, device="cuda", draw_on="device")
    lens = [n] * b
    p = GQADecodePlan(hq, hkv, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b)
    p.plan(lens)
    o = torch.empty_like(x["q"])
    s = gqa.gqa_launch_facts(gqa_workload(hq, hkv, b, n)).num_splits
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    calls = {"default gqa_decode()": lambda: gqa.gqa_decode(**x),
             f"gqa_decode(num_splits={s})": lambda: gqa.gqa_decode(**x, num_splits=s),
             "plan.run()": lambda: p.run(*args),
             "plan.run(out=, check=False)": lambda: p.run(*args, out=o, check=False)}
    ref = reference.gqa_decode(**x)
    for name, fn in calls.items():
        err = rel_err(fn(), ref)
        row = dict(shape=f"{hq}/{hkv}", batch=b, keys=n, call=name, rel_err=f"{err:.2e}",
                   eager_us=round(eager_us(fn), 1))
        if name.startswith("gqa_decode(num_splits"):
            row["graph_us"] = round(graph_us(fn), 1)
        if name.startswith("plan.run(out"):
            g = GQADecodePlan(hq, hkv, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b,
                              use_cuda_graph=True)
            g.plan(lens)
            row["graph_us"] = round(graph_us(lambda g=g: g.run(*args, out=o, check=False)), 1)
        rows.append(row)
        print(row, flush=True)
    return rows


def gqa_workload(hq: int, hkv: int, b: int, n: int):
    from splitlab.workloads import DecodeWorkload

    return DecodeWorkload("gqa", b, hq, hkv, 128, 128, n, page_size=16)


def replays(out: Path, count: int) -> None:
    """One graph captured once for a bucket of 16 requests and 8K keys, replayed after plan() with new lengths
    (zeros for padded slots) each time; every output checked against fp64."""
    b, n = 16, 8192
    x = gqa_inputs(b, 32, 8, 128, n, page_size=16, device="cuda", draw_on="device")
    p = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b, use_cuda_graph=True)
    rng = random.Random(5)
    p.plan([n] * b)
    o = torch.empty_like(x["q"])
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    p.run(*args, out=o, check=False)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p.run(*args, out=o, check=False)
    rows, bad = [], 0
    tol = TOLERANCE[torch.bfloat16]
    for i in range(count):
        live = rng.randint(1, b)
        lens = [rng.choice([0, 1, 63, 64, 65, rng.randint(1, n)]) for _ in range(live)] + [0] * (b - live)
        s = p.plan(lens)
        x["seq_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err = rel_err(o, reference.gqa_decode(**x))
        bad += not err <= tol
        rows.append(dict(replay=i, live=live, ctas=s.ctas, items=len(s.items), scheduler=s.scheduler,
                         rel_err=f"{err:.2e}", ok=err <= tol))
    write(out / "replays.csv", rows)
    print(f"{count} replays of one captured graph, new lengths each: {bad} outside the bf16 tolerance", flush=True)


def write(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=100)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    replays(out, a.replays)
    overhead(out)


if __name__ == "__main__":
    main()
