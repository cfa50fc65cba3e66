"""Schedules computed on the device (``kernels.device_schedule``), under Triton's interpreter: the kernel's work list
equals the host scheduler's bit for bit (items in order, rows, offsets, counts) on seeded random batches (0s, 1, 63,
64, 65, long, padded tails of zeros, batch 1..64; splitlab's over the workloads' length distributions and four
shapes, each candidate's modelled time equal to the host's to the bit); past a capacity it writes one bad item a
request and status 1; and
a plan with ``device_schedule=True`` (``plan_on_device``) makes no host sync and, its launches recorded once and
replayed after the device lengths change (a CUDA graph's replay, emulated), gives the fp64 reference's outputs."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

from splitlab import devices
from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.device_schedule import (
    NEGATIVE_LENGTH,
    OVER_CAPACITY,
    _least_across_lanes,
    schedule_on_device,
    splitlab_pricing,
)
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, poison_unread_pages_
from splitlab.planners import schedulers as S
from splitlab.planners import splitlab as rule
from splitlab.workloads import DecodeWorkload, draw_lengths

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


def test_flashmla_equals_the_host_scheduler():
    """FlashMLA's get_mla_metadata walk on the device (persistent: a part's span crosses requests, trailing parts
    empty): items, parts' CSR offsets, rows and the slot count (the parts) as schedulers.flashmla's."""
    rng = random.Random(7)
    for _ in range(60):
        lens = random_lens(rng)
        parts = rng.choice([1, 2, 7, 33, 66, 132])
        s = S.flashmla(lens, parts)
        assert s.ctas == parts and len(s.items) <= parts + len(lens)  # the capacity a plan sizes for it
        buf = device(lens, "flashmla", parts + len(lens), max(parts, len(lens)), ctas=parts, max_batch=64)
        assert_equal_to_host(buf, s)


# splitlab's scheduler: GQA 32/8, MQA-128 (one kv head, 128 rows), MLA-16 and MLA-128 (576/512).
SHAPES = {"gqa-32/8": ("gqa", 32, 8, 128, 128), "mqa-128": ("gqa", 128, 1, 128, 128),
          "mla-16": ("mla", 16, 1, 576, 512), "mla-128": ("mla", 128, 1, 576, 512)}
H200 = devices.get("h200")
#: The H200's constants on 8 SMs: every candidate's list schedule a few events long under the interpreter, most
#: launches past SCHEDULE_WAVES waves (the closed form) at a few dozen requests.
SMALL = dataclasses.replace(H200, sm_count=8)


def workload(shape: str, lens) -> DecodeWorkload:
    kind, hq, hkv, dqk, dv = SHAPES[shape]
    return DecodeWorkload(kind=kind, batch=len(lens), num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
                          head_dim_v=dv, ctx_len=max(max(lens), 1), page_size=64, dtype="bf16",
                          seq_lens=tuple(lens))


def ragged_lens(rng: random.Random, max_batch: int) -> list[int]:
    B = rng.choice([1, 2, 3, rng.randint(1, max_batch), max_batch])
    dist = rng.choice(["uniform", "spread4", "spread64", "longtail", "bimodal", "special"])
    longest = rng.choice([1, 64, 65, 700, 4096, 20_000, 70_001])
    lens = ([rng.choice(SPECIAL) for _ in range(B)] if dist == "special" else
            list(draw_lengths(dist, rng.randrange(1000), B, longest)))
    if B > 1 and rng.random() < 0.3:  # a padded tail of zeros
        pad = rng.randint(1, B - 1)
        lens[B - pad:] = [0] * pad
    return lens


def odd(c):
    """The constants with terms whose sums round (the shipped ones are short binary fractions, summed exactly)."""
    return dataclasses.replace(c, fixed=c.fixed * 1.1 + 0.01, item_fixed=c.item_fixed * 1.1 + 0.01 if c.item_fixed
                               else 0.0, partial=c.partial * 1.3 + 0.1,
                               combine_per_split=c.combine_per_split * 0.7 + 0.01,
                               drain=c.drain * 0.9 if c.drain > 0 else c.drain)


def splitlab_on_device(lens, shape, dev, cap_items, cap_ctas, constants=None, **pricing_kw):
    w = workload(shape, lens) if max(lens) > 0 <= min(lens) else None  # (the pricing reads the shape and batch)
    c = rule.constants_for(dev, SHAPES[shape][0]).constants if constants is None else constants
    pricing = dataclasses.replace(splitlab_pricing(workload(shape, [1] * len(lens)), dev, c, cap_items, "cpu"),
                                  **pricing_kw)
    buf = device(lens, "splitlab", cap_items, cap_ctas, pricing=pricing, max_batch=64)
    return buf, pricing, w, c


def host_prices(w, dev, c, cap_items, cap_ctas) -> dict[tuple[int, int], float]:
    """Each fitting candidate's modelled time as schedulers.splitlab prices it, by (uniform?, split count or budget)."""
    t = S.splitlab_terms(w, dev, c)
    lens = list(w.lengths)
    out = {}
    specs = [(1, n, S._uniform_tiles(lens, n, t.request_major))
             for n in rule.split_candidates(w, c.max_splits, dev.sm_count)]
    specs += [(0, b, S._balanced_tiles(lens, b)) for b in t.budgets]
    for uni, arg, (tiles, prows) in specs:
        if len(tiles) <= min(cap_items, cap_ctas):
            out[uni, arg] = S._priced([x * 1.0 for x in tiles], prows, t.h, t.slots, t.rate, t.cap, t.p,
                                      dev.sm_count, c)
    return out


def assert_prices_equal(pricing, want: dict) -> None:
    res = pricing.res_i.view(-1, 6).tolist()
    got = {(r[4], r[5]): f for r, f in zip(res, pricing.res_f.tolist(), strict=True) if r[0]}
    assert got == want  # the same candidates, each priced to the bit


@pytest.mark.parametrize("shape", list(SHAPES))
def test_splitlab_equals_the_host_scheduler(shape):
    """The device's choice and work list are schedulers.splitlab's within the capacity (the plan's default budget,
    and a tighter one that leaves candidates out), and every candidate's modelled time equals the host's exactly:
    on 8 SMs over many batches, on the H200 (132 SMs: list schedules of a few hundred CTAs) over a few."""
    rng = random.Random(100 + list(SHAPES).index(shape))
    for i in range(16):
        dev = H200 if i % 8 == 0 else SMALL
        lens = ragged_lens(rng, 16 if dev is H200 else 64)
        if max(lens) == 0:  # no workload describes it (a plan's host path: uniform at one split; below)
            continue
        B = len(lens)
        w = workload(shape, lens)
        base = S.slots_per_group(w, dev)
        cap = rng.choice([max(8 * B, 8 * base), max(B, base)])
        c = rule.constants_for(dev, w.kind).constants if i % 2 else odd(rule.constants_for(dev, w.kind).constants)
        buf, pricing, w, c = splitlab_on_device(lens, shape, dev, cap, cap, constants=c)
        assert_equal_to_host(buf, S.splitlab(w, dev, c, max_ctas=cap, max_items=cap, persistent=False))
        assert_prices_equal(pricing, host_prices(w, dev, c, cap, cap))


def test_splitlab_in_one_launch_writes_what_two_do(monkeypatch):
    """splitlab's pricing and schedule fused in one launch (``FUSED_PRICING``: the last program to count itself
    writes the schedule) write the same prices, work list and counts as the two launches, and leave the counter at
    zero for the next launch."""
    import splitlab.kernels.device_schedule as ds

    rng = random.Random(12)
    for shape in ("gqa-32/8", "mla-128"):
        for _ in range(3):
            lens = ragged_lens(rng, 24)
            got = []
            for fused in (True, False):
                monkeypatch.setattr(ds, "FUSED_PRICING", fused)
                buf, pricing, _, _ = splitlab_on_device(lens, shape, SMALL, 200, 200)
                got.append(([t.tolist() for t in buf.values()], pricing.res_f.tolist(), pricing.res_i.tolist()))
                assert pricing.arrived.item() == 0
            assert got[0] == got[1]


def test_splitlab_ties_break_as_the_hosts():
    """Exact ties: requests of one tile each (uniform at one split and every balanced budget deal the same items,
    priced the same to the bit): uniform at one split, the host's first; an all-empty batch too (what a plan's host
    path schedules for it)."""
    for lens in ([64] * 5, [1, 64, 30], [0] * 4):
        buf, pricing, _, _ = splitlab_on_device(lens, "gqa-32/8", SMALL, 64, 64)
        res = pricing.res_i.view(-1, 6).tolist()
        prices = [f for r, f in zip(res, pricing.res_f.tolist(), strict=True) if r[0]]
        assert len(prices) > 1 and len(set(prices)) == 1  # a tie of every candidate weighed
        assert_equal_to_host(buf, S.uniform(lens, 1))


@triton.jit
def _least_kernel(x_ptr, out_ptr):
    tl.store(out_ptr, _least_across_lanes(tl.load(x_ptr + tl.arange(0, 32))))


def test_the_least_end_across_lanes_is_the_min():
    """The pricing's cross-lane minimum (two 32-bit min-reductions of an order-preserving key) is the least of 32 fp64
    values, whatever their signs, magnitudes, infinities and ties."""
    rng = random.Random(9)
    for i in range(40):
        x = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(32)]
        if i % 4 == 1:
            x = [abs(v) for v in x]
        if i % 4 == 2:
            x = [rng.choice([float("inf"), 1.0, 1.0 + 2 ** -52, 2.0 ** 40]) for _ in range(32)]
        if i % 4 == 3:
            x = [rng.choice([float("inf"), float("-inf"), -0.0, 0.0, -5e-324, 5e-324]) for _ in range(32)]
        out = torch.zeros(1, dtype=torch.float64)
        _least_kernel[(1,)](torch.tensor(x, dtype=torch.float64), out)
        assert out.item() == min(x)


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
               dict(scheduler="stream_k", ctas=20, cap_items=40, cap_ctas=10),
               dict(scheduler="flashmla", ctas=8, cap_items=5, cap_ctas=10),
               dict(scheduler="flashmla", ctas=8, cap_items=40, cap_ctas=4)):
        buf = device(lens, **kw)
        assert buf["status"].item() == OVER_CAPACITY
        assert buf["num_ctas"].item() == 3
        assert buf["items"][:3].tolist() == [[r, 1, 0, -1] for r in range(3)]
        assert buf["partial_offsets"].tolist() == [0, 0, 0, 0]
    ok = device(lens, "balanced", 41, budget=40)  # the bound: max(budget, batch) items
    assert ok["status"].item() == 0


def test_a_negative_length_is_a_bad_item():
    """A negative device length (the host plan refuses it): its request's items keys [1, 0) (NaN, no key read), the
    others scheduled, status NEGATIVE_LENGTH; FlashMLA's walk and splitlab's choice take it as 0."""
    lens = [300, -5, 70]
    for buf in (device(lens, "flashmla", 12, 8, ctas=8),
                splitlab_on_device(lens, "mla-16", SMALL, 64, 64)[0]):
        assert buf["status"].item() == NEGATIVE_LENGTH
        items = buf["items"][:buf["cta_offsets"][buf["num_ctas"].item()].item()].tolist()
        assert all((b, e) == (1, 0) for r, b, e, _ in items if r == 1)
        assert {r for r, b, e, _ in items if (b, e) != (1, 0)} == {0, 2}


REUSE_MODES = [("balanced", dict(budget=33), lambda lens: S.balanced(lens, 33)),
               ("uniform", dict(num_splits=3), lambda lens: S.uniform(lens, 3)),
               ("stream_k", dict(ctas=7), lambda lens: S.stream_k(lens, 7)),
               ("flashmla", dict(ctas=7), lambda lens: S.flashmla(lens, 7)),
               ("splitlab", {}, None)]


@pytest.mark.parametrize("scheduler,kw,host", REUSE_MODES, ids=[m[0] for m in REUSE_MODES])
def test_reuse_keeps_the_schedule_of_the_same_lengths(scheduler, kw, host):
    """With a memo and reuse=True the kernels leave the buffers (and splitlab's prices) untouched for the lengths of
    the kept schedule, in a new tensor too, and write the host's schedule for any other lengths (one changed, another
    batch size); reuse=False forgets the memo, so the next reuse=True writes again."""
    cap = 200
    memo = torch.zeros(9, dtype=torch.int32)
    buf = buffers(cap, cap, 8)
    w0 = workload("mla-16", [1] * 5)
    pricing = splitlab_pricing(w0, SMALL, rule.constants_for(SMALL, "mla").constants, cap, "cpu")
    if scheduler == "splitlab":
        kw = dict(pricing=pricing)
        host = lambda lens: S.splitlab(workload("mla-16", lens), SMALL, max_ctas=cap, max_items=cap,  # noqa: E731
                                       persistent=False)

    def call(lens, reuse=True):
        B = len(lens)
        b = dict(buf, partial_offsets=buf["partial_offsets"][:B + 1])
        schedule_on_device(torch.tensor(lens, dtype=torch.int32), **b, scheduler=scheduler, max_batch=8,
                           memo=memo[:B + 1], reuse=reuse, **kw)
        return b

    def poison():
        for t in (*buf.values(), pricing.res_f, pricing.res_i):
            t.fill_(-7)

    a, b = [300, 0, 5000, 64, 129], [300, 0, 5000, 65, 129]
    assert_equal_to_host(call(a), host(a))
    assert memo[:6].tolist() == [5, *a]
    poison()
    call(list(a))
    assert all((t == -7).all() for t in (*buf.values(), pricing.res_f, pricing.res_i))  # kept: nothing written
    assert_equal_to_host(call(b), host(b))
    poison()
    assert_equal_to_host(call(b, reuse=False), host(b))
    assert memo[0].item() == 0  # forgotten
    poison()
    assert_equal_to_host(call(b), host(b))
    if scheduler != "splitlab":  # (the pricing is for one batch size)
        poison()
        assert_equal_to_host(call(b[:4]), host(b[:4]))  # another batch size: written, though its lengths are a prefix


def test_refusals_are_one_line():
    buf = buffers(8, 8, 2)
    t = torch.tensor([5, 6], dtype=torch.int32)
    for call, match in (
            (lambda: schedule_on_device(t, **buf, scheduler="flashinfer", budget=4), "scheduler='flashinfer'"),
            (lambda: schedule_on_device(t, **buf, scheduler="splitlab"), "pricing"),
            (lambda: schedule_on_device(t, **buf, scheduler="flashmla"), "ctas"),
            (lambda: schedule_on_device(t, **buf, scheduler="stream_k"), "ctas"),
            (lambda: schedule_on_device(t, **dict(buf, items=buf["items"][:1]), scheduler="balanced", budget=4),
             "at least the batch"),
            (lambda: schedule_on_device(t.long(), **buf, scheduler="balanced", budget=4), "1-D int32"),
            (lambda: schedule_on_device(torch.tensor([[5, 0], [6, 0]], dtype=torch.int32)[:, 0], **buf,
                                        scheduler="balanced", budget=4), r"contiguous 1-D int32 .* stride \(2,\)"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced"), "budget"),
            (lambda: schedule_on_device(t, **buf, scheduler="uniform"), "num_splits"),
            (lambda: schedule_on_device(t, **dict(buf, items=buf["items"].view(-1)), scheduler="balanced",
                                        budget=4), "expected \\[capacity, 4\\]"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced", budget=4, max_batch=1), "past max_batch"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced", budget=4, reuse=True), "reuse=True without"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced", budget=4, memo=t[:1].clone()),
             r"at least B \+ 1 = 3"),
            (lambda: schedule_on_device(t, **buf, scheduler="balanced", budget=4, memo=t.repeat(2), reuse=1),
             "reuse=1"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced",
                                   device_schedule=True), "use_cuda_graph=True"),
            (lambda: GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="flashinfer",
                                   device_schedule=True, use_cuda_graph=True), "stream_k, flashmla, splitlab"),
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


PLANS = [("balanced", dict(ctas=7)), ("uniform", dict(num_splits=3)), ("stream_k", dict(ctas=9)),
         ("stream_k", dict(ctas=5)), ("uniform", dict(num_splits=24)),  # 24 rows: merged in chunks
         ("splitlab", dict(device_spec=SMALL))]


@pytest.mark.parametrize("scheduler,knobs", PLANS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(PLANS)])
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


@pytest.mark.parametrize("scheduler,knobs", PLANS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(PLANS)])
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
    assert len(recorded) == 3  # the schedule (splitlab's: priced and written in one launch), the partials, the merge
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
    for scheduler, knobs in (("balanced", dict(ctas=5)), ("uniform", dict(num_splits=2)), ("stream_k", dict(ctas=5)),
                             ("flashmla", {}), ("splitlab", dict(device_spec=SMALL))):
        p = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler=scheduler, max_batch=4,
                          use_cuda_graph=True, device_schedule=True, **knobs)
        p.plan_on_device(torch.tensor(lens, dtype=torch.int32))
        out, lse = torch.full((4, 16, 64), float("nan")), torch.full((4, 16), float("nan"))
        p.run(x["q"], x["kv_cache"], x["block_table"], out=out, lse=lse)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])
        dev = p._meta.clone()
        s = p.plan(lens)  # the host scheduler's work list: the same
        n = len(s.items)
        assert dev[0] == s.ctas and p.status.item() == 0
        for lo, k in ((p._off_po, len(lens) + 1), (p._off_co, s.ctas + 1), (p._off_it, 4 * n)):
            assert torch.equal(dev[lo:lo + k], p._meta[lo:lo + k])


def test_plan_on_device_reuse_follows_the_lengths_and_host_plans(launches):
    """plan_on_device(reuse=True) as the default call makes it before every layer: recorded once, replayed over
    lengths changed in place (a kept schedule for repeated lengths, a new one for new lengths), and after a host
    plan() of other lengths (whose copy forgets the memo) a device plan of the first lengths again: each run the fp64
    reference's outputs for the lengths it was given."""
    a, b = [64, 5, 0, 0], [700, 300, 2, 0]
    x, _, _ = gqa_case(b, seed=6)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="splitlab", max_batch=4,
                      use_cuda_graph=True, device_schedule=True, device_spec=SMALL)
    lens_t = torch.tensor(a, dtype=torch.int32)
    out, lse = torch.full((4, 6, 32), float("nan")), torch.full((4, 6), float("nan"))

    def check(lens):
        ref, ref_lse = reference.gqa_decode(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                            torch.tensor(lens, dtype=torch.int32), return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [i for i, n in enumerate(lens) if n == 0])
        out.fill_(float("nan"))
        lse.fill_(float("nan"))

    p.plan_on_device(lens_t, reuse=True)
    p.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], out=out, lse=lse)
    recorded = list(launches)
    launches.clear()
    replay(recorded)
    check(a)
    for lens in (b, b, a, a):
        lens_t.copy_(torch.tensor(lens, dtype=torch.int32))
        replay(recorded)
        check(lens)
    p.plan(b)  # the host's schedule of b, copied over the buffers
    replay(launches)
    launches.clear()
    p.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], out=out, lse=lse)
    replay(launches)
    check(b)
    replay(recorded)  # lengths a, the memo's before the host plan: written again
    check(a)


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
import re
import splitlab.kernels.device_schedule as ds
from splitlab import devices
from splitlab.planners import splitlab as rule
from splitlab.workloads import DecodeWorkload

for name in ("_device_schedule_kernel", "_flashmla_kernel", "_splitlab_price_kernel", "_splitlab_plan_kernel"):
    setattr(ds, name, Warmup(getattr(ds, name)))
i32 = dict(dtype=torch.int32)
h200 = devices.get("h200")
w = DecodeWorkload(kind="gqa", batch=8, num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128, ctx_len=1,
                   page_size=16, dtype="bf16", seq_lens=(1,) * 8)
pricing = ds.splitlab_pricing(w, h200, rule.constants_for(h200, "gqa").constants, 300, "cpu")
# MLA-128: request-major, two head tiles a request, 132 slots (the pricing's other tile width)
m = DecodeWorkload(kind="mla", batch=8, num_q_heads=128, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, ctx_len=1,
                   page_size=64, dtype="bf16", seq_lens=(1,) * 8)
mla_pricing = ds.splitlab_pricing(m, h200, rule.constants_for(h200, "mla").constants, 300, "cpu")
blocks = []
for max_batch in (64, 1024):
    for kw in (dict(scheduler="balanced", budget=264), dict(scheduler="uniform", num_splits=4),
               dict(scheduler="uniform", num_splits=4, request_major=True), dict(scheduler="stream_k", ctas=264),
               dict(scheduler="flashmla", ctas=132), dict(scheduler="splitlab", pricing=pricing),
               dict(scheduler="splitlab", pricing=mla_pricing)):
        for fused in (True, False) if kw["scheduler"] == "splitlab" else (True,):  # one launch, or two
            ds.FUSED_PRICING = fused
            n0 = len(compiled)
            ds.schedule_on_device(torch.zeros(8, **i32), torch.zeros(300, 4, **i32), torch.zeros(301, **i32),
                                  torch.zeros(9, **i32), torch.zeros(1, **i32), torch.zeros(1, **i32),
                                  max_batch=max_batch, **kw)
            blocks += [max_batch] * (len(compiled) - n0)
        ds.FUSED_PRICING = True
for k, max_batch in zip(compiled, blocks, strict=True):
    ptx = k.asm["ptx"]
    assert "bar.sync" in ptx or "barrier" in ptx, "no CTA barrier"
    f64 = set(re.findall(r"\b(?:fma|mad|mul|add|sub|div)[.a-z]*\.f64", ptx))
    regs = ""
    if k.metadata.name.startswith(("_splitlab_price", "_splitlab_plan")):  # the host's roundings: no FMA, IEEE division
        assert f64 >= {"mul.rn.f64", "add.rn.f64", "div.rn.f64"} and not any("fma" in x or "mad" in x for x in f64), f64
        regs = usage(k)  # registers and stack: no spills at a block of 64 requests
        assert max_batch != 64 or regs == "?" or regs.endswith(" STACK:0"), regs
    print("ok", k.metadata.name, max_batch, k.metadata.num_warps, k.metadata.shared, sorted(f64), regs)
"""


def test_schedule_kernel_compiles_for_sm90():
    """The schedule kernels (the schedule kernel's five modes, FlashMLA's walk, splitlab's pricing for GQA 32/8,
    split-major, and MLA-128, request-major, fused with its schedule and alone; blocks of 64 and 1024 requests)
    compile for sm_90 (the interpreter checks
    no loop-carried types, fp64 lowering or barriers), with a CTA barrier in the PTX, the pricing's fp64 arithmetic
    rounded op by op as the host's (mul/add/div .rn, no FMA contraction) and, at 64 requests, no spills (registers
    and stack printed) (tests/sm90.py's stand-in driver: no GPU, nothing launched)."""
    from sm90 import compile_in_child

    r = compile_in_child(COMPILE)
    assert r.stdout.count("ok ") == 22, r.stdout
