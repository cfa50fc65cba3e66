"""Schedules computed on the device (``kernels.device_schedule``), compiled and run on the H200:
``SPLITLAB_GPU_TESTS=1 pytest tests/gpu/test_device_schedule_gpu.py -s``.

The compiled kernel's work list equals the host scheduler's bit for bit (batches 1..1024, the block a plan of that
capacity compiles); a plan with ``device_schedule=True`` captured once in a CUDA graph (``plan_on_device`` then
``run``) replays over new lengths in the same device tensor with the reference's results; and the schedule kernel's
time per replay (printed with ``-s``).
"""

import os
import random

import pytest
import torch

from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan
from splitlab.kernels.device_schedule import schedule_on_device
from splitlab.kernels.inputs import gqa_inputs
from splitlab.planners import schedulers as S

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a GPU and SPLITLAB_GPU_TESTS=1")

SPECIAL = [0, 1, 63, 64, 65, 4096, 70_001]


def lens_of(rng, B):
    lens = [rng.choice(SPECIAL) if rng.random() < 0.4 else rng.randint(0, 40_000) for _ in range(B)]
    if B > 1 and rng.random() < 0.3:
        pad = rng.randint(1, B - 1)
        lens[B - pad:] = [0] * pad
    return lens


def buffers(cap_items, batch):
    def full(*shape):
        return torch.full(shape, -7, dtype=torch.int32, device="cuda")
    return dict(items=full(cap_items, 4), cta_offsets=full(cap_items + 1), partial_offsets=full(batch + 1),
                num_ctas=full(1), status=full(1))


def check(buf, s):
    n = len(s.items)
    want = [[r, b, e, row] for (_, r, b, e), row in zip(s.items, s.item_rows, strict=True)]
    assert buf["items"][:n].tolist() == want
    assert buf["cta_offsets"][:s.ctas + 1].tolist() == list(s.cta_offsets)
    assert buf["partial_offsets"].tolist() == list(s.partial_offsets)
    assert (buf["num_ctas"].item(), buf["status"].item()) == (s.ctas, 0)


def test_equals_host_compiled():
    rng = random.Random(7)
    for max_batch in (64, 1024):
        for _ in range(30):
            B = rng.choice([1, 2, rng.randint(1, max_batch), max_batch])
            lens = lens_of(rng, B)
            t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            budget = rng.choice([1, 33, 264, 2048])
            buf = buffers(max(budget, B), B)
            schedule_on_device(t, **buf, scheduler="balanced", budget=budget, max_batch=max_batch)
            check(buf, S.balanced(lens, budget))
            for rm in (False, True):
                splits = rng.choice([1, 3, 8])
                buf = buffers(B * splits, B)
                schedule_on_device(t, **buf, scheduler="uniform", num_splits=splits, request_major=rm,
                                   max_batch=max_batch)
                check(buf, S.uniform(lens, splits, request_major=rm))
            ctas = rng.choice([1, 33, 132, 1000])
            buf = buffers(ctas + B, B)
            schedule_on_device(t, **buf, scheduler="stream_k", ctas=ctas, max_batch=max_batch)
            check(buf, S.stream_k(lens, ctas))


@pytest.mark.parametrize("scheduler,knobs", [("balanced", dict(ctas=132)), ("uniform", dict(num_splits=4)),
                                             ("stream_k", dict(ctas=132))])
def test_graph_replays_over_new_lengths(scheduler, knobs):
    B, max_keys = 32, 8192
    rng = random.Random(3)
    x = gqa_inputs(B, 32, 8, 128, [max_keys] * B, page_size=16, dtype=torch.bfloat16, device="cuda", seed=1)
    p = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", scheduler=scheduler, max_batch=B,
                      use_cuda_graph=True, device_schedule=True, **knobs)
    lens_t = torch.full((B,), 100, dtype=torch.int32, device="cuda")
    out = torch.empty(B, 32, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, 32, dtype=torch.float32, device="cuda")
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        p.plan_on_device(lens_t)
        p.run(*args, out=out, lse=lse)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p.plan_on_device(lens_t)
        p.run(*args, out=out, lse=lse)
    for _ in range(12):
        lens = [min(n, max_keys) for n in lens_of(rng, B)]
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref, ref_lse = reference.gqa_decode(*args, lens_t, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [i for i, n in enumerate(lens) if n == 0])
        assert p.status.item() == 0


def test_schedule_kernel_time():
    """The schedule kernel alone, per launch, replayed in a graph of 100 launches (printed)."""
    rng = random.Random(0)
    for max_batch, B in ((64, 8), (64, 64), (1024, 1024)):
        lens = [rng.randint(1, 30_000) for _ in range(B)]
        t = torch.tensor(lens, dtype=torch.int32, device="cuda")
        for name, kw, cap in (("balanced", dict(budget=264), max(264, B)),
                              ("uniform_split_major", dict(num_splits=8), B * 8),
                              ("uniform_request_major", dict(num_splits=8, request_major=True), B * 8),
                              ("stream_k", dict(ctas=264), 264 + B)):
            kw = dict(kw, scheduler="stream_k" if name == "stream_k" else name.split("_")[0])
            buf = buffers(cap, B)
            scratch = torch.empty(2 * max_batch, dtype=torch.int32, device="cuda")
            schedule_on_device(t, **buf, max_batch=max_batch, scratch=scratch, **kw)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(100):
                    schedule_on_device(t, **buf, max_batch=max_batch, scratch=scratch, **kw)
            g.replay()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                g.replay()
            b.record()
            torch.cuda.synchronize()
            us = a.elapsed_time(b) * 1000 / 1000
            print(f"schedule kernel {name} B={B} (block {max_batch}) items={buf['num_ctas'].item()}: {us:.2f} us")
