"""Sparse MLA behind plan/run (``kernels.decode_plan.SparseMLADecodePlan``), under Triton's interpreter: ``run()``
against the fp64 reference and ``sparse_mla_decode_scheduled`` on the same schedule (every scheduler sparse takes,
eager and capacity grid, per-token walked lengths whose unwalked slots hold NaN, tokens of only -1, every buffer
poisoned), buffers reused across plans, timelines recorded as the launcher records them, one-line refusals, and the
capacity-grid (BOUNDED) kernel with and without the timeline compiled for sm_90a."""

from __future__ import annotations

import random

import pytest
import torch
from triton.runtime.jit import KernelInterface

from splitlab.errors import SplitlabError
from splitlab.kernels import reference, timeline
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import SparseMLADecodePlan
from splitlab.kernels.inputs import poison_unread_slots_, sparse_mla_inputs
from splitlab.kernels.sparse_mla import sparse_mla_decode_scheduled, walked_indices
from splitlab.kernels.worklist import WorkList

H, DQK, DV, TOPK = 5, 48, 32, 100
LENS = [100, 0, 37, 1, 64]  # per-token walked lengths: an empty token, one of a single position


def case(lens, seed=7, dtype=torch.float32, empty_rows=0):
    """Inputs whose unwalked slots (past a token's length, or never named) hold NaN, and the reference on the walked
    prefix."""
    x = sparse_mla_inputs(len(lens), H, DQK, TOPK, num_slots=400, invalid_frac=0.2, empty_rows=empty_rows,
                          dtype=dtype, seed=seed)
    walked = walked_indices(x["indices"], tuple(lens))
    poison_unread_slots_(x["kv_cache"], walked)
    ref, ref_lse = reference.sparse_mla_decode(**dict(x, indices=walked), head_dim_v=DV, return_lse=True)
    rows = [t for t in range(len(lens)) if not (walked[t] >= 0).any()]
    return x, ref, ref_lse, rows


def make(**kw) -> SparseMLADecodePlan:
    return SparseMLADecodePlan(H, DQK, DV, **dict(dict(dtype=torch.float32, device="cpu", block_k=16), **kw))


def one_line(e) -> None:
    assert "\n" not in str(e.value), str(e.value)


SCHEDULERS = [("splitlab", {}), ("uniform", dict(num_splits=3)), ("balanced", dict(ctas=7)),
              ("stream_k", dict(ctas=4))]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("scheduler,knobs", SCHEDULERS, ids=[s for s, _ in SCHEDULERS])
def test_run_matches_reference_and_the_launcher(allocs, graph, scheduler, knobs):
    x, ref, ref_lse, rows = case(LENS)
    p = make(scheduler=scheduler, use_cuda_graph=graph, max_batch=5, max_ctas=40, max_items=40, **knobs)
    s = p.plan(LENS, indices=x["indices"], num_slots=400)
    assert s.lengths == tuple(LENS)
    allocs.clear()
    out, lse = p.run(x["q"], x["kv_cache"], x["indices"], return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, rows)
    assert not torch.isnan(out).any() and not torch.isnan(lse[[t for t in range(5) if t not in rows]]).any()
    want, want_lse = sparse_mla_decode_scheduled(**x, work=WorkList.from_schedule(s, "cpu"), head_dim_v=DV,
                                                 block_k=16, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_tokens_of_only_invalid_indices_and_an_all_empty_batch():
    x = sparse_mla_inputs(3, H, DQK, 60, num_slots=90, empty_rows=2, dtype=torch.float16, seed=4)
    p = make(dtype=torch.float16, scheduler="uniform", num_splits=3, use_cuda_graph=True, max_batch=3, max_ctas=12,
             max_items=12)
    p.plan([60] * 3)
    out, lse = p.run(x["q"], x["kv_cache"], x["indices"], out=torch.full((3, H, DV), float("nan"),
                                                                          dtype=torch.float16), return_lse=True)
    assert torch.all(out[1:] == 0) and torch.all(torch.isneginf(lse[1:]))
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()
    p.plan([0, 0, 0])  # no token walks anything: zeros and -inf, whatever the indices hold
    out, lse = p.run(x["q"], x["kv_cache"], x["indices"], return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_replanning_reuses_the_buffers(allocs):
    p = make(scheduler="uniform", num_splits=2, use_cuda_graph=True, max_batch=5, max_ctas=20, max_items=20)
    buffers = None
    for lens in (LENS, [3, 100, 50], [0, 0, 0, 0, 0], LENS):
        p.plan(lens)
        now = [t.data_ptr() for t in (p._meta, p._items, p._cta_offsets, p._partial_offsets, p._num_ctas, p._po,
                                      p._pl, p._lse)]
        assert buffers is None or now == buffers
        buffers = now
        x, ref, ref_lse, rows = case(lens, seed=len(lens))
        out, lse = p.run(x["q"], x["kv_cache"], x["indices"], return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, rows)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_timelines_are_the_launchers_records(graph):
    x, _, _, _ = case(LENS)
    p = make(scheduler="uniform", num_splits=3, use_cuda_graph=graph, max_batch=5, max_ctas=24, max_items=24)
    s = p.plan(LENS)
    plain_out, plain_lse = p.run(x["q"], x["kv_cache"], x["indices"], return_lse=True)
    t = timeline.Timelines()
    out, lse = p.run(x["q"], x["kv_cache"], x["indices"], out=torch.full_like(plain_out, float("nan")),
                     return_lse=True, timelines=t)
    assert torch.equal(out, plain_out) and torch.equal(lse, plain_lse, )
    recs = t.read()
    _, want = timeline.record(lambda tt: sparse_mla_decode_scheduled(
        **x, work=WorkList.from_schedule(s, "cpu"), head_dim_v=DV, block_k=16, timelines=tt))
    assert recs["partial"] == want["partial"] and len(want["partial"]) == s.ctas  # one head tile of 5 heads
    assert recs["merge"] == want["merge"] and want["merge"]
    assert [r["item"] for r in want["partial"]] == list(range(s.ctas))
    if graph:
        assert t.buffers["partial"].shape[0] == 24  # the capacity's programs


def test_graph_replay_after_a_new_plan_and_no_host_sync(monkeypatch):
    """What a CUDA graph does, on the CPU: run() recorded at plan A (no device value read on the host while it
    launches), a new plan B of the same batch (more slots and partial rows), the recorded launches replayed into the
    same out / lse: B's result (the capacity grid, its slots past B's count exit)."""
    a, b = [10, 0, 5, 1, 2], LENS
    x, ref, ref_lse, rows = case(b, seed=3)
    p = make(scheduler="uniform", num_splits=4, use_cuda_graph=True, max_batch=5, max_ctas=24, max_items=24)
    p.plan(a)
    real = KernelInterface.__getitem__
    calls: list = []
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *args, **kw: calls.append((self, grid, args, kw)))

    def sync(*args, **kw):
        raise AssertionError("a host read in run()")

    out, lse = torch.full((5, H, DV), float("nan")), torch.full((5, H), float("nan"))
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "to"):
            m.setattr(torch.Tensor, name, sync)
        p.run(x["q"], x["kv_cache"], x["indices"], out=out, lse=lse)
    assert len(calls) == 2 and calls[0][1] == (24,)  # the partial kernel on the capacity's slots, and the merge
    sb = p.plan(b)
    assert sb.ctas > p.plan(a).ctas and p.plan(b).partial_rows > 0
    for kernel, grid, args, kw in calls:
        real(kernel, grid)(*args, **kw)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, rows)


DEVICE = [("balanced", dict(ctas=7)), ("uniform", dict(num_splits=3)), ("stream_k", dict(ctas=9))]


@pytest.mark.parametrize("scheduler,knobs", DEVICE, ids=[s for s, _ in DEVICE])
def test_plan_on_device_is_the_host_plan(allocs, scheduler, knobs):
    """plan_on_device(t) leaves the packed work list (slot count, partial offsets, cta offsets, items) as plan(list)
    leaves it for per-token walked lengths (0 to topk, tile edges), and run() after it gives the reference's result."""
    p = make(scheduler=scheduler, max_batch=8, use_cuda_graph=True, device_schedule=True, **knobs)
    rng = random.Random(5)
    for _ in range(5):
        lens = [rng.choice([0, 1, 15, 16, 17, 37, 64, 100]) for _ in range(rng.randint(1, 8))]
        lens[0] = max(lens[0], 1)  # the host's all-empty batch is uniform's one item a token (stream-K's differs)
        s = p.plan(lens)
        host = p._meta.clone()
        p._meta.fill_(-7)
        t = torch.tensor(lens, dtype=torch.int32)
        p.plan_on_device(t)
        n = len(s.items)
        assert p._num_ctas.item() == s.ctas and p.status.item() == 0 and p.schedule is None
        assert torch.equal(p._partial_offsets[:len(lens) + 1], host[p._off_po:p._off_po + len(lens) + 1])
        assert torch.equal(p._cta_offsets[:s.ctas + 1], host[p._off_co:p._off_co + s.ctas + 1])
        assert torch.equal(p._items[:n], host[p._off_it:p._off_it + 4 * n].view(n, 4))
    x, ref, ref_lse, rows = case(LENS, seed=11)
    p.plan_on_device(torch.tensor(LENS, dtype=torch.int32))
    out, lse = p.run(x["q"], x["kv_cache"], x["indices"], return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, rows)


def test_refusals_are_one_line():
    x, _, _, _ = case(LENS)
    q, kv, idx = x["q"], x["kv_cache"], x["indices"]
    p = make(max_batch=5)
    with pytest.raises(SplitlabError, match=r"SparseMLADecodePlan\.run before plan\(\); expected plan\(topk_lens"):
        p.run(q, kv, idx)
    cases = [
        (lambda: p.plan([1] * 6), "6 requests is past max_batch=5"),
        (lambda: p.plan([5, -1]), r"topk_lens\[1\] = -1"),
        (lambda: p.plan([101, 0, 0, 0, 0], indices=idx), r"topk_lens\[0\] = 101 is past indices' 100 columns"),
        (lambda: p.plan(LENS, indices=idx[:4]), "indices has 4 rows; expected one per token"),
        (lambda: p.plan(LENS, indices=idx, num_slots=10), r"expected values in \[-1, num_slots\)"),
        (lambda: p.plan(LENS, indices=idx.long()), "indices"),
        (lambda: make(scheduler="uniform", num_splits=8, max_items=5).plan(LENS), "past max_items=5"),
        (lambda: make(max_ctas=2, max_batch=5), "at least max_batch"),
        (lambda: make(scheduler="flashmla"), r"64 or 128 \(FlashMLA sparse decode\)"),
        (lambda: SparseMLADecodePlan(64, 576, 512, dtype=torch.float32, device="cpu", scheduler="flashmla",
                                     use_cuda_graph=True, device_schedule=True), "with scheduler 'flashmla'"),
        (lambda: make(scheduler="flashinfer"), "not allowed for kind sparse_mla"),
        (lambda: make(use_cuda_graph=True, device_schedule=True), r"device_schedule=True\) with scheduler 'splitlab'"),
        (lambda: make(scheduler="uniform", device_schedule=True), "without use_cuda_graph"),
        (lambda: make(kv_dtype=torch.float8_e4m3fn), "beside an"),
        (lambda: make(block_k=48), "block_k=48"),
        (lambda: make(dtype=torch.int32), "dtype="),
    ]
    for call, match in cases:
        with pytest.raises(SplitlabError, match=match) as e:
            call()
        one_line(e)
    p.plan(LENS)
    runs = [
        (lambda: p.run(q.half(), kv, idx), "q has dtype torch.float16; expected torch.float32"),
        (lambda: p.run(q, kv.half(), idx), "kv_cache has dtype"),
        (lambda: p.run(q[:2], kv, idx), r"q has shape \(2, 5, 48\); expected \[5, 5, 48\]"),
        (lambda: p.run(q, kv, idx.long()), "indices has dtype torch.int64"),
        (lambda: p.run(q, kv, idx[:, :50]), "the plan reads up to key 100; indices holds 50 keys"),
        (lambda: p.run(q, kv, idx[:3]), r"indices has shape \(3, 100\); expected \[5, topk\]"),
        (lambda: p.run(q, kv[:, :32], idx), r"kv_cache has shape \(400, 32\); expected \[num_slots, 48\]"),
        (lambda: p.run(q, kv, idx, out=torch.empty(5, 5, 31)), "out has shape"),
        (lambda: p.run(q.clone().requires_grad_(), kv, idx), "requires grad"),
    ]
    for call, match in runs:
        with pytest.raises(SplitlabError, match=match) as e:
            call()
        one_line(e)


COMPILE = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.sparse_mla as smla
import splitlab.kernels.timeline as timeline
import splitlab.kernels.worklist as wl
from splitlab.kernels.decode_plan import SparseMLADecodePlan
from splitlab.kernels.inputs import sparse_mla_inputs
from splitlab.planners import schedulers as S

smla._sparse_mla_worklist_kernel = Warmup(smla._sparse_mla_worklist_kernel)
import splitlab.kernels.workitems as wi
wi._merge_kernel = Warmup(wi._merge_kernel)
launch_common.check_launch_device = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched
launch_common.check_indices = lambda *a: None
timeline.clock_on = lambda device: True  # the GPU build: the clock read (CPU tensors stand in)

x = sparse_mla_inputs(2, 64, 512, 256, num_slots=600, dtype=torch.bfloat16)
lens = [256, 100]
work = wl.WorkList.from_schedule(S.uniform(lens, 4, tile=64, request_major=True), "cpu")
p = SparseMLADecodePlan(64, 512, 512, dtype=torch.bfloat16, device="cpu", scheduler="uniform", num_splits=4,
                        use_cuda_graph=True, max_batch=2, max_ctas=16, max_items=16)
p.plan(lens)
builds = {}
for name, launch in (
    ("launcher", lambda: smla.sparse_mla_decode_scheduled(**x, work=work, validate=False)),
    ("launcher timed", lambda: smla.sparse_mla_decode_scheduled(**x, work=work, validate=False,
                                                                  timelines=timeline.Timelines())),
    ("bounded", lambda: p.run(x["q"], x["kv_cache"], x["indices"], check=False)),
    ("bounded timed", lambda: p.run(x["q"], x["kv_cache"], x["indices"], check=False,
                                    timelines=timeline.Timelines())),
):
    n0 = len(compiled)
    launch()
    builds[name] = compiled[n0]
failed = False
for name, k in builds.items():
    ptx = k.asm["ptx"]
    timed = name.endswith("timed")
    if timed != (ptx.count("%globaltimer") >= 2 and "%smid" in ptx) or (not timed and "%globaltimer" in ptx):
        print(f"CLOCK {name}: globaltimer x{ptx.count('%globaltimer')}, smid x{ptx.count('%smid')}")
        failed = True
    print(f"ok {name}: {usage(k)}, shared {k.metadata.shared} B")
plain, bounded = builds["launcher"], builds["bounded"]
if (plain.metadata.shared, usage(plain)) != (bounded.metadata.shared, usage(bounded)):
    print(f"USAGE: launcher's {usage(plain)}, bounded {usage(bounded)}")
    failed = True
sys.exit(1 if failed else 0)
"""


def test_bounded_and_timed_kernels_compile_for_sm90():
    """The sparse work-list kernel as the plan launches it (BOUNDED, capacity grid; DeepSeek-V4-like 64 heads, 512/512,
    bf16) compiles for sm_90 with the launcher's registers, stack and shared memory; with timelines on, the
    launcher's and the plan's builds read ``%globaltimer`` twice and ``%smid``, the plain builds neither
    (tests/sm90.py's stand-in driver: no GPU, nothing launched)."""
    from sm90 import compile_in_child

    r = compile_in_child(COMPILE)
    print(r.stdout)
    assert r.stdout.count("ok ") == 4, r.stdout


def test_flashmla_plans_sparse_decode_as_its_library_does():
    """``scheduler="flashmla"`` at 64 heads, D 576 / 512: the plan's schedule is ``schedulers.flashmla_schedule``'s
    (FlashMLA's sparse decode metadata over the tokens' walked top-k), within the capacity its SM parts give."""
    from splitlab.planners import schedulers as S
    from splitlab.workloads import DecodeWorkload

    p = SparseMLADecodePlan(64, 576, 512, dtype=torch.float32, device="cpu", scheduler="flashmla", max_batch=8,
                            device_spec="h200")
    lens = [2048, 0, 77, 1300, 64, 65, 2048, 1]
    s = p.plan(lens)
    w = DecodeWorkload("sparse_mla", 8, 64, 1, 576, 512, 65536, page_size=1, topk=2048, seq_lens=tuple(lens))
    assert s.scheduler == "flashmla" and s.digest == S.flashmla_schedule(w, p.spec).digest
    assert p.capacity.ctas >= s.ctas and p.capacity.items >= len(s.items)
