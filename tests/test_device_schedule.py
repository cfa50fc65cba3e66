"""Schedules computed on the device (``kernels.device_schedule``), under Triton's interpreter: the kernel's work list
equals the host scheduler's bit for bit (items in order, rows, offsets, counts) on seeded random batches (0s, 1, 63,
64, 65, long, padded tails of zeros, batch 1..64); past a capacity it writes one bad item a request and status 1; and
a plan with ``device_schedule=True`` (``plan_on_device``) makes no host sync and, its launches recorded once and
replayed after the device lengths change (a CUDA graph's replay, emulated), gives the fp64 reference's outputs."""

from __future__ import annotations

import random

import pytest
import torch
from triton.runtime.jit import KernelInterface

from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.device_schedule import OVER_CAPACITY, schedule_on_device
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, poison_unread_pages_
from splitlab.planners import schedulers as S

REAL_GETITEM = KernelInterface.__getitem__
SPECIAL = [0, 1, 63, 64, 65, 127, 128, 129, 4096, 10_000, 70_001]


def random_lens(rng: random.Random) -> list[int]:
    B = rng.choice([1, 2, 3, rng.randint(1, 64), 64])
    lens = [rng.choice(SPECIAL) if rng.random() < 0.5 else rng.randint(0, 20_000) for _ in range(B)]
    if B > 1 and rng.random() < 0.3:  # a padded tail of zeros
        pad = rng.randint(1, B - 1)
        lens[B - pad:] = [0] * pad
    if rng.random() < 0.1:
        lens = [0] * B
    return lens


def buffers(cap_items: int, cap_ctas: int, batch: int):
    fill = -7  # never what a schedule writes where it writes
    return dict(items=torch.full((cap_items, 4), fill, dtype=torch.int32),
                cta_offsets=torch.full((cap_ctas + 1,), fill, dtype=torch.int32),
                partial_offsets=torch.full((batch + 1,), fill, dtype=torch.int32),
                num_ctas=torch.full((1,), fill, dtype=torch.int32), status=torch.full((1,), fill, dtype=torch.int32))


def assert_equal_to_host(buf: dict, s) -> None:
    n = len(s.items)
    want = [[r, b, e, row] for (_, r, b, e), row in zip(s.items, s.item_rows, strict=True)]
    assert buf["items"][:n].tolist() == want
    assert buf["cta_offsets"][:s.ctas + 1].tolist() == list(s.cta_offsets)
    assert buf["partial_offsets"].tolist() == list(s.partial_offsets)
    assert (buf["num_ctas"].item(), buf["status"].item()) == (s.ctas, 0)


def device(lens, scheduler, cap_items, cap_ctas=None, **kw):
    buf = buffers(cap_items, cap_items if cap_ctas is None else cap_ctas, len(lens))
    schedule_on_device(torch.tensor(lens, dtype=torch.int32), **buf, scheduler=scheduler, **kw)
    return buf


def test_balanced_equals_the_host_scheduler():
    rng = random.Random(36)
    for _ in range(60):
        lens = random_lens(rng)
        budget = rng.choice([1, 7, 33, 132, 264, 1000])
        s = S.balanced(lens, budget)
        assert len(s.items) <= max(budget, len(lens))  # the capacity a plan sizes for it
        assert_equal_to_host(device(lens, "balanced", max(budget, len(lens)), budget=budget, max_batch=64), s)


@pytest.mark.parametrize("request_major", [False, True], ids=["split_major", "request_major"])
def test_uniform_equals_the_host_scheduler(request_major):
    rng = random.Random(2 + request_major)
    for _ in range(40):
        lens = random_lens(rng)
        splits = rng.choice([1, 2, 3, 8, 17])
        s = S.uniform(lens, splits, request_major=request_major)
        buf = device(lens, "uniform", len(lens) * splits + 3, num_splits=splits, request_major=request_major)
        assert_equal_to_host(buf, s)


def test_stream_k_equals_the_host_scheduler():
    """Stream-K (persistent: several items a slot, a span crossing requests): items, slots' CSR offsets, rows and the
    slot count (the CTAs, not the items) as schedulers.stream_k's."""
    rng = random.Random(11)
    for _ in range(60):
        lens = random_lens(rng)
        ctas = rng.choice([1, 2, 7, 33, 132, 1000])
        s = S.stream_k(lens, ctas)
        assert s.ctas <= ctas and len(s.items) <= ctas + len(lens)  # the capacity a plan sizes for it
        buf = device(lens, "stream_k", ctas + len(lens), max(ctas, len(lens)), ctas=ctas, max_batch=64)
        assert_equal_to_host(buf, s)


def test_past_capacity_is_one_bad_item_a_request():
    """A schedule past the items, the CTA slots or the partial rows: one item a request of keys [1, 0) (its request
    NaN, no key read), no partial rows, status 1."""
    lens = [5000, 0, 300]
    for kw in (dict(scheduler="balanced", budget=40, cap_items=10),
               dict(scheduler="balanced", budget=40, cap_items=64, cap_ctas=8),
               dict(scheduler="balanced", budget=40, cap_items=64, max_partial_rows=4),
               dict(scheduler="uniform", num_splits=4, cap_items=6),
               dict(scheduler="uniform", num_splits=4, cap_items=6, request_major=True),
               dict(scheduler="stream_k", ctas=20, cap_items=10, cap_ctas=30),
               dict(scheduler="stream_k", ctas=20, cap_items=40, cap_ctas=10)):
        buf = device(lens, **kw)
        assert buf["status"].item() == OVER_CAPACITY
        assert buf["num_ctas"].item() == 3
        assert buf["items"][:3].tolist() == [[r, 1, 0, -1] for r in range(3)]
        assert buf["partial_offsets"].tolist() == [0, 0, 0, 0]
    ok = device(lens, "balanced", 41, budget=40)  # the bound: max(budget, batch) items
    assert ok["status"].item() == 0


def test_refusals_are_one_line():
    buf = buffers(8, 8, 2)
    t = torch.tensor([5, 6], dtype=torch.int32)
    for call, match in (
            (lambda: schedule_on_device(t, **buf, scheduler="splitlab", budget=4), "scheduler='splitlab'"),
            (lambda: schedule_on_device(t, **buf, scheduler="stream_k"), "ctas"),
            (lambda: schedule_on_device(t, **dict(buf, items=buf["items"][:1]), scheduler="balanced", budget=4),
             "at least the batch"),
            (lambda: schedule_on_device(t.long(), **buf, scheduler="balanced", budget=4), "1-D int32"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced"), "budget"),
            (lambda: schedule_on_device(t, **buf, scheduler="uniform"), "num_splits"),
            (lambda: schedule_on_device(t, **dict(buf, items=buf["items"].view(-1)), scheduler="balanced",
                                        budget=4), "expected \\[capacity, 4\\]"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced", budget=4, max_batch=1), "past max_batch"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced",
                                   device_schedule=True), "use_cuda_graph=True"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="flashinfer",
                                   device_schedule=True, use_cuda_graph=True), "balanced, uniform or stream_k"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform",
                                   device_schedule=True, use_cuda_graph=True), "num_splits"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced",
                                   device_schedule=1, use_cuda_graph=True), "device_schedule=1"),
    ):
        with pytest.raises(SplitlabError, match=match) as e:
            call()
        assert "\n" not in str(e.value)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced", ctas=5, max_batch=2,
                      use_cuda_graph=True)
    with pytest.raises(SplitlabError, match="device_schedule=True"):
        p.plan_on_device(t)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced", ctas=5, max_batch=2,
                      use_cuda_graph=True, device_schedule=True)
    for bad_lens, match in ((t.long(), "1-D int32"), (torch.zeros(3, dtype=torch.int32), "past max_batch=2"),
                            ([5, 6], "1-D int32")):
        with pytest.raises(SplitlabError, match=match):
            p.plan_on_device(bad_lens)


# --- the plan -------------------------------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch):
    calls: list = []
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *a, **kw: calls.append((self, grid, a, kw)))
    return calls


def replay(calls: list) -> None:
    for kernel, grid, args, kwargs in calls:
        REAL_GETITEM(kernel, grid)(*args, **kwargs)


def gqa_case(lens, seed=0):
    x = gqa_inputs(len(lens), 6, 2, 32, lens, page_size=16, dtype=torch.float32, seed=seed)
    poison_unread_pages_(x["k_cache"], x["block_table"], lens, 16)
    poison_unread_pages_(x["v_cache"], x["block_table"], lens, 16)
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    return x, ref, ref_lse


PLANS = [("balanced", dict(ctas=7)), ("uniform", dict(num_splits=3)), ("stream_k", dict(ctas=9))]


@pytest.mark.parametrize("scheduler,knobs", PLANS, ids=[s for s, _ in PLANS])
def test_plan_on_device_writes_the_host_plans_work_list(scheduler, knobs):
    """plan_on_device(t) leaves the plan's packed work list (slot count, partial offsets, cta offsets, items) as
    plan(list) leaves it, for the lengths both are given."""
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler=scheduler, max_batch=8,
                      use_cuda_graph=True, device_schedule=True, **knobs)
    rng = random.Random(5)
    for _ in range(6):
        lens = [rng.choice(SPECIAL[:9]) for _ in range(rng.randint(1, 8))]
        if max(lens) == 0 and scheduler == "stream_k":  # the host plan's all-empty batch: uniform's one item a slot
            lens[0] = 1
        s = p.plan(lens)
        host = p._meta.clone()
        p._meta.fill_(-7)
        p.plan_on_device(torch.tensor(lens, dtype=torch.int32))
        n = len(s.items)
        assert p._num_ctas.item() == s.ctas and p.status.item() == 0
        assert torch.equal(p._partial_offsets[:len(lens) + 1], host[p._off_po:p._off_po + len(lens) + 1])
        assert torch.equal(p._cta_offsets[:s.ctas + 1], host[p._off_co:p._off_co + s.ctas + 1])
        assert torch.equal(p._items[:n], host[p._off_it:p._off_it + 4 * n].view(n, 4))


@pytest.mark.parametrize("scheduler,knobs", PLANS, ids=[s for s, _ in PLANS])
def test_graph_replay_over_new_device_lengths(launches, scheduler, knobs):
    """What a CUDA graph does, on the CPU: plan_on_device and run recorded once at lengths A (a device tensor), the
    tensor's values changed in place (B, then C with a padded tail, then A again), the recorded launches replayed:
    each time the fp64 reference's outputs for the new lengths."""
    a, b, c = [64, 5, 0, 0], [700, 300, 2, 0], [129, 0, 0, 0]
    x, _, _ = gqa_case(b, seed=2)  # b's table and caches hold a's and c's keys too
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler=scheduler, max_batch=4,
                      use_cuda_graph=True, device_schedule=True, **knobs)
    lens_t = torch.tensor(a, dtype=torch.int32)
    out, lse = torch.full((4, 6, 32), float("nan")), torch.full((4, 6), float("nan"))
    p.plan_on_device(lens_t)
    p.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], out=out, lse=lse)
    recorded = list(launches)
    assert len(recorded) == 3  # the schedule, the partial kernel, the merge
    for lens in (b, c, a, b):
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        replay(recorded)
        ref, ref_lse = reference.gqa_decode(x["q"], x["k_cache"], x["v_cache"], x["block_table"], lens_t,
                                            return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [i for i, n in enumerate(lens) if n == 0])
        assert p.status.item() == 0


def test_mla_plan_on_device_matches_reference():
    lens = [150, 0, 64, 1]
    x = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    poison_unread_pages_(x["kv_cache"], x["block_table"], lens, 64)
    ref, ref_lse = reference.mla_decode(**x, head_dim_v=64, return_lse=True)
    for scheduler, knobs in (("balanced", dict(ctas=5)), ("uniform", dict(num_splits=2)), ("stream_k", dict(ctas=5))):
        p = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler=scheduler, max_batch=4,
                          use_cuda_graph=True, device_schedule=True, **knobs)
        p.plan_on_device(torch.tensor(lens, dtype=torch.int32))
        out, lse = p.run(x["q"], x["kv_cache"], x["block_table"], return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])


def test_over_capacity_run_is_nan():
    """A capacity smaller than the bound, a batch past it: every row NaN, status 1 (nothing read back to decide)."""
    lens = [700, 300]
    x, _, _ = gqa_case(lens, seed=4)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=4,
                      max_batch=2, max_ctas=4, max_items=4, use_cuda_graph=True, device_schedule=True)
    p.plan_on_device(torch.tensor(lens, dtype=torch.int32))
    out, lse = p.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], return_lse=True)
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    assert p.status.item() == OVER_CAPACITY


def test_plan_on_device_makes_no_host_sync(monkeypatch, launches):
    """Every way of reading a device value on the host raises while plan_on_device and run launch (recorded, not
    run)."""
    lens_t = torch.tensor([130, 0, 17, 64], dtype=torch.int32)
    x, _, _ = gqa_case([130, 0, 17, 64])
    g = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced", max_batch=4,
                      use_cuda_graph=True, device_schedule=True)

    def sync(*a, **k):
        raise AssertionError("a host read in plan_on_device")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "to"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    for _ in range(2):
        launches.clear()
        g.plan_on_device(lens_t)
        g.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], return_lse=True)
        assert len(launches) == 3


COMPILE = r"""
import splitlab.kernels.device_schedule as ds

ds._device_schedule_kernel = Warmup(ds._device_schedule_kernel)
i32 = dict(dtype=torch.int32)
for max_batch in (64, 1024):
    for kw in (dict(scheduler="balanced", budget=264), dict(scheduler="uniform", num_splits=4),
               dict(scheduler="uniform", num_splits=4, request_major=True), dict(scheduler="stream_k", ctas=264)):
        ds.schedule_on_device(torch.zeros(8, **i32), torch.zeros(300, 4, **i32), torch.zeros(301, **i32),
                              torch.zeros(9, **i32), torch.zeros(1, **i32), torch.zeros(1, **i32),
                              max_batch=max_batch, **kw)
for k in compiled:
    assert "bar.sync" in k.asm["ptx"] or "barrier" in k.asm["ptx"], "no CTA barrier"
    print("ok", k.metadata.name, k.metadata.num_warps, k.metadata.shared)
"""


def test_schedule_kernel_compiles_for_sm90():
    """The schedule kernel (its four modes, blocks of 64 and 1024 requests) compiles for sm_90 (the interpreter
    checks no loop-carried types or barriers), with a CTA barrier in the PTX (tests/sm90.py's stand-in
    driver: no GPU, nothing launched)."""
    from sm90 import compile_in_child

    r = compile_in_child(COMPILE)
    assert r.stdout.count("ok ") == 8
