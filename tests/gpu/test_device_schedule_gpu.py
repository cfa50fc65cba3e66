"""Schedules computed on the device (``kernels.device_schedule``), compiled and run on the H200:
``SPLITLAB_GPU_TESTS=1 pytest tests/gpu/test_device_schedule_gpu.py -s``.

The compiled kernels' work list equals the host scheduler's bit for bit (batches 1..1024, the block a plan of that
capacity compiles; FlashMLA's walk; splitlab's choice within a plan's default capacity on the H200's 132 SMs, every
candidate's fp64 price equal to the host's: the GPU's fp64 arithmetic, not the interpreter's numpy); a plan with
``device_schedule=True`` captured once in a CUDA graph (``plan_on_device`` then ``run``) replays over new lengths in
the same device tensor with the reference's results (GQA: balanced, uniform, stream-K, splitlab; MLA: FlashMLA,
splitlab; with ``reuse=True``, each lengths replayed twice: splitlab for GQA, FlashMLA for MLA); and each scheduler's
kernels' time per replay, and FlashMLA's and splitlab's where they keep the schedule (printed with ``-s``).
"""

import os
import random

import pytest
import torch

from splitlab import devices
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.device_schedule import schedule_on_device, splitlab_pricing
from splitlab.kernels.inputs import gqa_inputs, mla_inputs
from splitlab.planners import schedulers as S
from splitlab.planners import splitlab as rule
from splitlab.workloads import DecodeWorkload

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


def buffers(cap_items, batch, cap_ctas=None):
    def full(*shape):
        return torch.full(shape, -7, dtype=torch.int32, device="cuda")
    return dict(items=full(cap_items, 4), cta_offsets=full((cap_ctas or cap_items) + 1),
                partial_offsets=full(batch + 1), num_ctas=full(1), status=full(1))


H200 = devices.get("h200")
SHAPES = {"gqa-32/8": ("gqa", 32, 8, 128, 128), "mqa-128": ("gqa", 128, 1, 128, 128),
          "mla-16": ("mla", 16, 1, 576, 512), "mla-128": ("mla", 128, 1, 576, 512)}


def workload(shape, lens):
    kind, hq, hkv, dqk, dv = SHAPES[shape]
    return DecodeWorkload(kind=kind, batch=len(lens), num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
                          head_dim_v=dv, ctx_len=max(max(lens), 1), page_size=64, dtype="bf16",
                          seq_lens=tuple(lens))


def splitlab_case(shape, lens, max_batch):
    """(buffers, pricing, capacity) of splitlab on the device for ``lens`` at a plan's default capacity."""
    B = len(lens)
    w1 = workload(shape, [1] * B)
    c = rule.constants_for(H200, w1.kind).constants
    cap = max(8 * B, 8 * S.slots_per_group(w1, H200))
    pricing = splitlab_pricing(w1, H200, c, cap, "cuda")
    buf = buffers(cap, B)
    t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    schedule_on_device(t, **buf, scheduler="splitlab", pricing=pricing, max_batch=max_batch)
    return buf, pricing, cap, c


def check(buf, s):
    n = len(s.items)
    want = [[r, b, e, row] for (_, r, b, e), row in zip(s.items, s.item_rows, strict=True)]
    assert buf["items"][:n].tolist() == want
    assert buf["cta_offsets"][:s.ctas + 1].tolist() == list(s.cta_offsets)
    assert buf["partial_offsets"].tolist() == list(s.partial_offsets)
    assert (buf["num_ctas"].item(), buf["status"].item()) == (s.ctas, 0)


def assert_replays_over_new_lengths(p, args, lens_t, out, lse, rng, max_keys, ref_of, reuse=False):
    """Captures ``p.plan_on_device(lens_t, reuse=reuse)`` then ``p.run`` in one CUDA graph, then replays it 12 times
    over new lengths written into ``lens_t`` (with ``reuse``, twice each: the second keeps the schedule; outputs
    NaN-poisoned each time), checking each replay against ``ref_of()`` (the fp64 reference's (out, lse) for the
    lengths in ``lens_t``) and the plan's status."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        p.plan_on_device(lens_t, reuse=reuse)
        p.run(*args, out=out, lse=lse)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p.plan_on_device(lens_t, reuse=reuse)
        p.run(*args, out=out, lse=lse)
    for _ in range(12):
        lens = [min(n, max_keys) for n in lens_of(rng, len(lens_t))]
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        for _ in range(1 + reuse):
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            ref, ref_lse = ref_of()
            assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16,
                                     [i for i, n in enumerate(lens) if n == 0])
            assert p.status.item() == 0


def schedule_kernel_us(t, buf, max_batch, kw):
    """Microseconds per launch of the schedule kernel alone on lengths ``t`` into ``buf``: 100 launches captured in
    one CUDA graph, replayed once to warm up, then 10 replays timed (1000 launches)."""
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
    return a.elapsed_time(b) * 1000 / 1000


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
            parts = rng.choice([1, 33, 66, 132])
            buf = buffers(parts + B, B, max(parts, B))
            schedule_on_device(t, **buf, scheduler="flashmla", ctas=parts, max_batch=max_batch)
            check(buf, S.flashmla(lens, parts))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_splitlab_equals_host_compiled(shape):
    """splitlab's choice on the GPU (fp64 there: division, no FMA) equals schedulers.splitlab's within a plan's
    default capacity, and every fitting candidate's price equals the host's _priced to the bit."""
    rng = random.Random(200 + list(SHAPES).index(shape))
    for max_batch in (64, 256):
        for _ in range(25):
            B = rng.choice([1, 2, rng.randint(1, max_batch), max_batch])
            lens = lens_of(rng, B)
            if max(lens) == 0:
                lens[0] = 1
            buf, pricing, cap, c = splitlab_case(shape, lens, max_batch)
            w = workload(shape, lens)
            check(buf, S.splitlab(w, H200, max_ctas=cap, max_items=cap, persistent=False))
            terms = S.splitlab_terms(w, H200, c)
            want = {}
            for n in rule.split_candidates(w, c.max_splits, H200.sm_count):
                tiles, prows = S._uniform_tiles(lens, n, terms.request_major)
                if len(tiles) <= cap:
                    want[1, n] = S._priced([x * 1.0 for x in tiles], prows, terms.h, terms.slots, terms.rate,
                                           terms.cap, terms.p, H200.sm_count, c)
            for b in terms.budgets:
                tiles, prows = S._balanced_tiles(lens, b)
                if len(tiles) <= cap:
                    want[0, b] = S._priced([x * 1.0 for x in tiles], prows, terms.h, terms.slots, terms.rate,
                                           terms.cap, terms.p, H200.sm_count, c)
            res = pricing.res_i.view(-1, 6).tolist()
            got = {(r[4], r[5]): f for r, f in zip(res, pricing.res_f.tolist(), strict=True) if r[0]}
            assert got == want


@pytest.mark.parametrize("scheduler,knobs,reuse", [("balanced", dict(ctas=132), False),
                                                   ("uniform", dict(num_splits=4), False),
                                                   ("stream_k", dict(ctas=132), False), ("splitlab", {}, False),
                                                   ("splitlab", {}, True)])
def test_graph_replays_over_new_lengths(scheduler, knobs, reuse):
    B, max_keys = 32, 8192
    rng = random.Random(3)
    x = gqa_inputs(B, 32, 8, 128, [max_keys] * B, page_size=16, dtype=torch.bfloat16, device="cuda", seed=1)
    p = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", scheduler=scheduler, max_batch=B,
                      use_cuda_graph=True, device_schedule=True, **knobs)
    lens_t = torch.full((B,), 100, dtype=torch.int32, device="cuda")
    out = torch.empty(B, 32, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, 32, dtype=torch.float32, device="cuda")
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    assert_replays_over_new_lengths(p, args, lens_t, out, lse, rng, max_keys,
                                    lambda: reference.gqa_decode(*args, lens_t, return_lse=True), reuse)


@pytest.mark.parametrize("scheduler,reuse", [("flashmla", False), ("splitlab", False), ("flashmla", True)])
def test_mla_graph_replays_over_new_lengths(scheduler, reuse):
    B, max_keys = 16, 8192
    rng = random.Random(4)
    x = mla_inputs(B, 128, 576, [max_keys] * B, page_size=64, dtype=torch.bfloat16, device="cuda", seed=1)
    p = MLADecodePlan(128, 576, 512, 64, dtype=torch.bfloat16, device="cuda", scheduler=scheduler, max_batch=B,
                      use_cuda_graph=True, device_schedule=True)
    lens_t = torch.full((B,), 100, dtype=torch.int32, device="cuda")
    out = torch.empty(B, 128, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, 128, dtype=torch.float32, device="cuda")
    args = (x["q"], x["kv_cache"], x["block_table"])
    assert_replays_over_new_lengths(p, args, lens_t, out, lse, rng, max_keys,
                                    lambda: reference.mla_decode(*args, lens_t, head_dim_v=512, return_lse=True), reuse)


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
            us = schedule_kernel_us(t, buf, max_batch, kw)
            print(f"schedule kernel {name} B={B} (block {max_batch}) items={buf['num_ctas'].item()}: {us:.2f} us")
        for name, shape in (("flashmla", "mla-128"), ("splitlab", "gqa-32/8"), ("splitlab", "mla-16"),
                            ("splitlab", "mla-128")):
            if name == "flashmla":
                buf = buffers(132 + B, B, max(132, B))
                kw = dict(scheduler="flashmla", ctas=132)
            else:
                buf, pricing, _, _ = splitlab_case(shape, lens, max_batch)
                kw = dict(scheduler="splitlab", pricing=pricing)
            us = schedule_kernel_us(t, buf, max_batch, kw)
            memo = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
            kept = schedule_kernel_us(t, buf, max_batch, dict(kw, memo=memo, reuse=True))  # all but the first kept
            print(f"schedule kernels {name} {shape if name == 'splitlab' else ''} B={B} (block {max_batch}) "
                  f"items={buf['num_ctas'].item()}: {us:.2f} us, kept (reuse, same lengths) {kept:.2f} us")


def test_price_warps(monkeypatch):
    """splitlab's pricing at 1, 2 and 4 warps a program (``device_schedule.PRICE_WARPS``): the same prices and work
    list at each, and each one's time a launch (printed: GQA 32/8 and MLA-16 at 16 and 64 requests of 500-6000 keys,
    as a chat batch, and of 1-30000)."""
    import splitlab.kernels.device_schedule as ds

    rng = random.Random(9)
    for shape in ("gqa-32/8", "mla-16"):
        for B, hi in ((16, 6000), (64, 6000), (64, 30_000)):
            lens = [rng.randint(500 if hi == 6000 else 1, hi) for _ in range(B)]
            t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            got = {}
            for warps in (1, 2, 4):
                monkeypatch.setattr(ds, "PRICE_WARPS", warps)
                buf, pricing, _, _ = splitlab_case(shape, lens, 64)
                us = schedule_kernel_us(t, buf, 64, dict(scheduler="splitlab", pricing=pricing))
                got[warps] = (pricing.res_f.tolist(), buf["items"].tolist())
                print(f"price warps {warps} {shape} B={B} keys<={hi}: {us:.2f} us")
            assert got[1] == got[2] == got[4]
