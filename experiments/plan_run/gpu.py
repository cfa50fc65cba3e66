"""Plan once, run every layer, on a GPU: what a call costs eager against its kernels replayed in a CUDA graph, and
one graph captured once replayed over many batches of new lengths (the capacity grid), checked against fp64; and
schedules computed on the device: a graph that holds the schedule kernels beside the decode's against the same graph
with a host-made schedule, the schedule kernels' own time, and one such graph replayed over many batches of random
lengths and padding, each output checked against fp64 and the work list against the host scheduler's.

    python experiments/plan_run/gpu.py --out OUT [--replays 100] [--device-replays 1000] [--only device] [--seed N]

The default launchers' call is timed on both paths: the split-count path and through a cached plan scheduled on
the device (``kernels.default_call``, eager and in a graph). Writes OUT/plan_run_gpu.csv (one row per call kind and
shape), OUT/replays.csv (one row per replayed batch) and
OUT/device_schedule.csv (one row per shape and scheduler).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time
from pathlib import Path

import torch

from splitlab.bench.csvrows import write_rows
from splitlab.kernels import decode_plan, default_call, gqa, mla, reference
from splitlab.kernels import device_schedule as ds
from splitlab.kernels.accuracy import TOLERANCE, rel_err
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs

SHAPES = [(32, 8, 8, 4096), (32, 8, 64, 4096)]  # (query heads, kv heads, batch, keys): the GQA rows
MLA_SHAPE = (128, 16, 8192)  # (heads, batch, keys): its MLA row


def eager_us(fn, calls: int = 200, rounds: int = 5) -> float:
    """Wall time per call of ``calls`` back-to-back eager calls (host and GPU together), after a warm-up: the median
    of ``rounds`` rounds (one round moved by up to 1.4x between runs of the same call on one machine)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


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
    rows = [row for shape in SHAPES for row in one_shape(*shape)]
    write_rows(out / "plan_run_gpu.csv", rows + mla_shape(*MLA_SHAPE))


def timed(name: str, fn, ref, graph: bool, **row) -> dict:
    """One row: ``fn``'s error against ``ref``, its eager wall time a call and, with ``graph``, its graph replay."""
    row = dict(row, call=name, rel_err=f"{rel_err(fn(), ref):.2e}", eager_us=round(eager_us(fn), 1))
    if graph:
        row["graph_us"] = round(graph_us(fn), 1)
    print(row, flush=True)
    return row


def mla_shape(h: int, b: int, n: int) -> list[dict]:
    """The issue's MLA row: the default call (split count, and through a plan), ``plan.run()`` eager and in a
    graph."""
    x = mla_inputs(b, h, 576, n, page_size=64, device="cuda", draw_on="device")
    p = MLADecodePlan(h, 576, 512, 64, dtype=torch.bfloat16, device="cuda", max_batch=b)
    p.plan([n] * b)
    g = MLADecodePlan(h, 576, 512, 64, dtype=torch.bfloat16, device="cuda", max_batch=b, use_cuda_graph=True)
    g.plan([n] * b)
    o = torch.empty(b, h, 512, dtype=torch.bfloat16, device="cuda")
    args = (x["q"], x["kv_cache"], x["block_table"])
    ref = reference.mla_decode(**x, head_dim_v=512)
    shape = dict(shape=f"mla-{h}", batch=b, keys=n)
    return [timed("default mla_decode()", lambda: mla.mla_decode(**x, head_dim_v=512), ref, False, **shape),
            timed("default mla_decode() via plan", default_call.with_plan(lambda: mla.mla_decode(**x, head_dim_v=512)),
                  ref, True, **shape),
            timed(NEW_LENGTHS.format("mla"), default_call.with_plan(
                turning(x, lambda y: mla.mla_decode(**y, head_dim_v=512))), ref, False, **shape),
            timed("plan.run()", lambda: p.run(*args), ref, False, **shape),
            timed("plan.run(check=False)", lambda: p.run(*args, check=False), ref, False, **shape),
            timed("plan.run(out=)", lambda: p.run(*args, out=o), ref, False, **shape),
            dict(timed("plan.run(out=, check=False)", lambda: p.run(*args, out=o, check=False), ref, False, **shape),
                 graph_us=round(graph_us(lambda: g.run(*args, out=o, check=False)), 1))]


def one_shape(hq: int, hkv: int, b: int, n: int) -> list[dict]:
    rows = []
    x = gqa_inputs(b, hq, hkv, 128, n, page_size=16, device="cuda", draw_on="device")
    lens = [n] * b
    p = GQADecodePlan(hq, hkv, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b)
    p.plan(lens)
    pdl = GQADecodePlan(hq, hkv, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b, pdl=True)
    pdl.plan(lens)
    o = torch.empty_like(x["q"])
    s = gqa.gqa_launch_facts(gqa_workload(hq, hkv, b, n)).num_splits
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    calls = {"default gqa_decode()": lambda: gqa.gqa_decode(**x),
             "default gqa_decode() via plan": default_call.with_plan(lambda: gqa.gqa_decode(**x)),
             NEW_LENGTHS.format("gqa"): default_call.with_plan(turning(x, lambda y: gqa.gqa_decode(**y))),
             f"gqa_decode(num_splits={s})": lambda: gqa.gqa_decode(**x, num_splits=s),
             "plan.run()": lambda: p.run(*args),
             "plan.run(check=False)": lambda: p.run(*args, check=False),
             "plan.run(out=)": lambda: p.run(*args, out=o),
             "plan.run(out=, check=False)": lambda: p.run(*args, out=o, check=False),
             "plan.run(out=, check=False) pdl": lambda: pdl.run(*args, out=o, check=False)}
    ref = reference.gqa_decode(**x)
    for name, fn in calls.items():
        err = rel_err(fn(), ref)
        row = dict(shape=f"{hq}/{hkv}", batch=b, keys=n, call=name, rel_err=f"{err:.2e}",
                   eager_us=round(eager_us(fn), 1))
        if name.startswith("gqa_decode(num_splits") or name.endswith("via plan"):
            row["graph_us"] = round(graph_us(fn), 1)
        if name.startswith("plan.run(out"):
            g = GQADecodePlan(hq, hkv, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=b,
                              use_cuda_graph=True, pdl=name.endswith("pdl"))
            g.plan(lens)
            row["graph_us"] = round(graph_us(lambda g=g: g.run(*args, out=o, check=False)), 1)
        rows.append(row)
        print(row, flush=True)
    return rows


#: The default call through a plan given other lengths at every call (its schedule made each time; the row above it
#: gives the same lengths, as every layer of a step does, and keeps the schedule after the first call).
NEW_LENGTHS = "default {}_decode() via plan, new lengths"


def turning(x: dict, call):
    """``call`` of inputs ``x`` with their lengths, then the lengths one shorter, in turn (each call a schedule to
    make; the first call's output the reference's)."""
    lens = itertools.cycle([x["seq_lens"], x["seq_lens"] - 1])
    return lambda: call(dict(x, seq_lens=next(lens)))


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
    write_rows(out / "replays.csv", rows)
    print(f"{count} replays of one captured graph, new lengths each: {bad} outside the bf16 tolerance", flush=True)


#: Device-schedule cases: (label, batch bucket, longest keys, schedulers). GQA 32/8/128 page 16, MLA 576/512 page 64,
#: bf16: the issue's shapes.
DEVICE_CASES = [("GQA 32/8", 8, 4096, ("splitlab", "balanced", "stream_k")),
                ("GQA 32/8", 64, 4096, ("splitlab", "balanced", "stream_k")),
                ("MLA-16", 16, 8192, ("splitlab", "flashmla")),
                ("MLA-128", 16, 8192, ("splitlab", "flashmla"))]


def capture(fn):
    """A CUDA graph of ``fn`` (run once on a side stream first: compiles and warms outside the capture)."""
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
    return g


def replay_us(g, replays: int = 200) -> float:
    """Per replay of a captured graph, by CUDA events over ``replays`` back-to-back replays (best of 3)."""
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / replays * 1e3)
    return best


#: Layers a decode step runs on one plan (Llama-3-8B's 32): the step graph of device_case.
LAYERS = 32
#: Merge tiles (rows a chunk) a device plan's step is also timed at, beside the rule's (``device_merge_rows``).
MERGE_ROWS = (4, 8, 16, 32)


def random_lens(rng: random.Random, b: int, n: int) -> list[int]:
    """A bucket of ``b`` slots: 1..b live requests of random lengths (edges 0, 1, 63-65 among them), the rest padding
    (length 0)."""
    live = rng.randint(1, b)
    return [rng.choice([0, 1, 63, 64, 65, rng.randint(1, n)]) for _ in range(live)] + [0] * (b - live)


def device_case(label: str, b: int, n: int, scheduler: str, count: int, rng: random.Random) -> tuple[dict, list]:
    """One shape and scheduler: host-schedule graph vs device-schedule graph (same lengths, same schedule), the
    schedule kernels alone, then ``count`` replays of the device graph over new lengths, each output against fp64
    (and every 10th work list against the host plan's)."""
    if label.startswith("GQA"):
        x = gqa_inputs(b, 32, 8, 128, n, page_size=16, device="cuda", draw_on="device")
        args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])

        def make(**kw):
            return GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", scheduler=scheduler,
                                 max_batch=b, use_cuda_graph=True, **kw)

        def ref(lens_t):
            return reference.gqa_decode(*args, lens_t)
    else:
        heads = int(label.split("-")[1])
        x = mla_inputs(b, heads, 576, n, page_size=64, device="cuda", draw_on="device")
        args = (x["q"], x["kv_cache"], x["block_table"])

        def make(**kw):
            return MLADecodePlan(heads, 576, 512, 64, dtype=torch.bfloat16, device="cuda", scheduler=scheduler,
                                 max_batch=b, use_cuda_graph=True, **kw)

        def ref(lens_t):
            return reference.mla_decode(*args, lens_t, head_dim_v=512)
    host, dev = make(), make(device_schedule=True)
    lens0 = [rng.randint(n // 16, n) for _ in range(b)]
    lens_t = torch.tensor(lens0, dtype=torch.int32, device="cuda")
    host.plan(lens0)
    o = torch.empty(b, args[0].shape[1], 512 if label.startswith("MLA") else 128, dtype=torch.bfloat16,
                    device="cuda")
    g_host = capture(lambda: host.run(*args, out=o, check=False))
    g_dev = capture(lambda: (dev.plan_on_device(lens_t), dev.run(*args, out=o, check=False)))
    g_sched = capture(lambda: [dev.plan_on_device(lens_t) for _ in range(20)])
    host_us, dev_us = replay_us(g_host), replay_us(g_dev)
    sched_us = replay_us(g_sched, 20) / 20
    # a server's step: one plan serves every layer (LAYERS decodes of the same cache, the graph a step captures)
    g_host_step = capture(lambda: [host.run(*args, out=o, check=False) for _ in range(LAYERS)])
    g_dev_step = capture(lambda: (dev.plan_on_device(lens_t), [dev.run(*args, out=o, check=False)
                                                               for _ in range(LAYERS)]))
    host_step, dev_step = replay_us(g_host_step, 20), replay_us(g_dev_step, 20)
    del g_host_step, g_dev_step
    two = {}  # splitlab's pricing and schedule in two launches (ds.FUSED_PRICING off), the A/B
    if scheduler == "splitlab":
        was, ds.FUSED_PRICING = ds.FUSED_PRICING, False
        try:
            d2 = make(device_schedule=True)
            g = capture(lambda: [d2.plan_on_device(lens_t) for _ in range(20)])
            two["schedule_kernels_two_launches_us"] = round(replay_us(g, 20) / 20, 2)
            g = capture(lambda: (d2.plan_on_device(lens_t), [d2.run(*args, out=o, check=False)
                                                             for _ in range(LAYERS)]))
            two["device_step_two_launches_us"] = round(replay_us(g, 20), 2)
            del g, d2
        finally:
            ds.FUSED_PRICING = was
    # The merge tile apart: the host plan's step with the device plan's merge tile (the same work list, so the ratio
    # to host_step is the tile's cost), and device plans whose merge tile holds other row counts a chunk.
    planned = host._planned
    host._planned = dataclasses.replace(planned, merge_grid=dev._planned.merge_grid, merge_meta=dev._planned.merge_meta)
    g = capture(lambda: [host.run(*args, out=o, check=False) for _ in range(LAYERS)])
    host_step_dev_tile = replay_us(g, 20)
    host._planned = planned
    del g
    tiles = {}
    for rows_a_chunk in MERGE_ROWS:
        was, decode_plan.DEVICE_MERGE_ROWS = decode_plan.DEVICE_MERGE_ROWS, rows_a_chunk
        try:
            d = make(device_schedule=True)
            g = capture(lambda d=d: (d.plan_on_device(lens_t), [d.run(*args, out=o, check=False)
                                                                for _ in range(LAYERS)]))
            tiles[rows_a_chunk] = round(replay_us(g, 20), 2)
            del g, d
        finally:
            decode_plan.DEVICE_MERGE_ROWS = was
    same = work_list_equal(dev, host)
    rows, bad, differ, checked = [], 0, 0, 0
    tol = TOLERANCE[torch.bfloat16]
    for i in range(count):
        lens = random_lens(rng, b, n)
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        o.fill_(float("nan"))
        g_dev.replay()
        torch.cuda.synchronize()
        err = rel_err(o, ref(lens_t))
        ok = err <= tol and dev.status.item() == 0
        bad += not ok
        if i % 10 == 0 and max(lens) > 0:
            host.plan(lens)
            torch.cuda.synchronize()
            differ += not work_list_equal(dev, host)
            checked += 1
        rows.append(dict(case=label, scheduler=scheduler, replay=i, live=sum(v > 0 for v in lens),
                         rel_err=f"{err:.2e}", ok=ok))
    row = dict(case=label, scheduler=scheduler, batch=b, keys=n, host_schedule_graph_us=round(host_us, 2),
               device_schedule_graph_us=round(dev_us, 2), ratio=round(dev_us / host_us, 4),
               schedule_kernels_us=round(sched_us, 2), step_layers=LAYERS, host_step_graph_us=round(host_step, 2),
               device_step_graph_us=round(dev_step, 2), step_ratio=round(dev_step / host_step, 4), **two,
               host_step_device_merge_tile_us=round(host_step_dev_tile, 2),
               merge_rows=dev._planned.merge_meta["BLOCK_S"],
               **{f"device_step_merge_rows_{r}_us": us for r, us in tiles.items()},
               same_work_list=same, replays=count, outside_tolerance=bad,
               work_lists_checked=checked, work_lists_differing=differ)
    print(row, flush=True)
    return row, rows


def work_list_equal(dev, host) -> bool:
    """The device plan's work list (slot count, partial offsets, CTA offsets, items) equals the host plan's."""
    s = host.schedule
    n, b = len(s.items), s.batch
    m, h = dev._meta, host._meta
    return all(torch.equal(m[lo:lo + k], h[lo:lo + k]) for lo, k in (
        (0, 1), (host._off_po, b + 1), (host._off_co, s.ctas + 1), (host._off_it, 4 * n)))


def device_schedule(out: Path, count: int, seed: int = 36) -> None:
    rng = random.Random(seed)
    rows, replayed = [], []
    for label, b, n, schedulers in DEVICE_CASES:
        for scheduler in schedulers:
            row, r = device_case(label, b, n, scheduler, count, rng)
            rows.append(row)
            replayed += r
    write_rows(out / "device_schedule.csv", rows)
    write_rows(out / "device_replays.csv", replayed)
    print(f"device schedules: {sum(r['outside_tolerance'] for r in rows)} of {len(replayed)} replays outside the "
          f"bf16 tolerance, {sum(r['work_lists_differing'] for r in rows)} work lists unlike the host's", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--device-replays", type=int, default=1000, help="replays per device-schedule case")
    ap.add_argument("--only", choices=["host", "device"], help="the host-plan runs or the device-schedule runs alone")
    ap.add_argument("--seed", type=int, default=36, help="the device-schedule cases' lengths (another seed: fresh "
                    "batches, e.g. to confirm a rule chosen on earlier runs)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.only != "device":
        replays(out, a.replays)
        overhead(out)
    if a.only != "host":
        device_schedule(out, a.device_replays, a.seed)


if __name__ == "__main__":
    main()
