"""The work-list launchers on the warp-specialized Gluon kernels (``kernels.mla_sm90_ws``, ``kernels.mqa_sm90_ws``,
dispatched by their ``use_ws``), run on an sm_90 GPU: ``SPLITLAB_GPU_TESTS=1 pytest tests/gpu/test_ws_dispatch_gpu.py``.

``worklist.mla_decode_scheduled`` / ``gqa_decode_scheduled`` and ``MLADecodePlan`` / ``GQADecodePlan`` (eager, and
captured once in a CUDA graph at the capacity grid, replayed over new lengths with padded requests) against the fp64
reference: MLA at 40-128 heads (odd head counts: a partly filled head tile), MQA at 64 and 128 heads, pages 16 and
64; lengths 0, 1, 63-65 and long, outputs NaN-filled before each replay; the same work list on the tl tile
(``ENABLED`` off) agreeing; and a recorded timeline (one clocked record a program).
"""

import os
import random

import pytest
import torch

from splitlab import devices
from splitlab.kernels import mla_sm90_ws as ws
from splitlab.kernels import mqa_sm90_ws as mqa_ws
from splitlab.kernels import reference
from splitlab.kernels.accuracy import assert_matches_reference, rel_err
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs
from splitlab.kernels.timeline import Timelines
from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled, mla_decode_scheduled
from splitlab.planners import schedulers as S
from splitlab.workloads import DecodeWorkload

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability()[0] != 9, reason="needs an sm_90 GPU and SPLITLAB_GPU_TESTS=1")

LENS = [0, 1, 63, 64, 65, 3000, 700, 9000]


def _ref(x, lens):
    return reference.mla_decode(x["q"], x["kv_cache"], x["block_table"], torch.tensor(lens), head_dim_v=512,
                                return_lse=True)


def _work(heads, lens):
    w = DecodeWorkload(kind="mla", batch=len(lens), num_q_heads=heads, num_kv_heads=1, head_dim_qk=576,
                       head_dim_v=512, ctx_len=max(lens), page_size=64, dtype="bf16", seq_lens=tuple(lens))
    return WorkList.from_schedule(S.splitlab(w, devices.get("h200"), persistent=False), "cuda")


def replay_plan(p, args, out, lse, graph: bool, steps, ref_of) -> None:
    """Plan ``p`` for each batch of lengths in ``steps`` and run it (eager, or one CUDA graph captured at the first
    batch and replayed), the outputs NaN-filled before each run and checked against ``ref_of(lens)``."""
    p.plan(steps[0])
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            p.run(*args, out=out, lse=lse)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            p.run(*args, out=out, lse=lse)
    for lens in steps:
        p.plan(lens)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        if graph:
            g.replay()
        else:
            p.run(*args, out=out, lse=lse)
        torch.cuda.synchronize()
        ref, ref_lse = ref_of(lens)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [i for i, n in enumerate(lens) if n == 0])


def random_steps(rng, batch: int, longest: int, n: int = 5) -> list[list[int]]:
    """``LENS`` then ``n`` batches of random lengths (0, 1, 65 or drawn up to ``longest``)."""
    return [LENS] + [[rng.choice([0, 1, 65, rng.randint(1, longest)]) for _ in range(batch)] for _ in range(n)]


@pytest.mark.parametrize("heads", [40, 64, 128])
def test_the_scheduled_launcher_runs_it_and_matches_fp64(heads, monkeypatch):
    x = mla_inputs(len(LENS), heads, 576, LENS, page_size=64, dtype=torch.bfloat16, device="cuda", seed=heads)
    work = _work(heads, LENS)
    assert ws.use_ws(torch.bfloat16, torch.bfloat16, 576, 512, (64, 64, 8, 2), 64, x["q"].device, False,
                     work.schedule.align)
    out, lse = mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], work, return_lse=True)
    ref, ref_lse = _ref(x, LENS)
    assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [0])
    monkeypatch.setattr(ws, "ENABLED", False)  # the tl tile on the same work list
    tl_out = mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], work)
    assert rel_err(out, tl_out.double()) < 5e-3


@pytest.mark.parametrize("heads", [16, 128])
def test_the_persistent_seesaw_switched_on_matches_fp64(heads, monkeypatch):
    """``PERSISTENT_VARIANT`` set (as its A/B would ship it): the scheduled launcher on stream-K and FlashMLA schedules
    (several items a slot, an empty request among them) and a FlashMLA-scheduled plan, eager and replayed in a graph
    over new lengths, against fp64 (at 16 heads the default tile stays the tl tile: only 40 heads and more)."""
    monkeypatch.setattr(ws, "PERSISTENT_VARIANT", "seesaw-persistent")
    x = mla_inputs(len(LENS), heads, 576, LENS, page_size=64, dtype=torch.bfloat16, device="cuda", seed=heads + 1)
    ref, ref_lse = _ref(x, LENS)
    for s in (S.stream_k(LENS, 5), S.flashmla(LENS, 3)):
        out, lse = mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], WorkList.from_schedule(s, "cuda"),
                                        return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [0])
    rng = random.Random(heads)
    B = 8
    y = mla_inputs(B, heads, 576, 9000, page_size=64, dtype=torch.bfloat16, device="cuda", seed=12)
    for graph in (False, True):
        p = MLADecodePlan(heads, 576, 512, 64, dtype=torch.bfloat16, device="cuda", scheduler="flashmla", max_batch=B,
                          use_cuda_graph=graph)
        assert p._ws == (heads >= 40)
        out = torch.empty(B, heads, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, heads, dtype=torch.float32, device="cuda")
        replay_plan(p, (y["q"], y["kv_cache"], y["block_table"]), out, lse, graph, random_steps(rng, B, 9000),
                    lambda lens: _ref(y, lens))


def test_a_timeline_records_every_program():
    x = mla_inputs(len(LENS), 128, 576, LENS, page_size=64, dtype=torch.bfloat16, device="cuda", seed=3)
    work = _work(128, LENS)
    t = Timelines()
    mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], work, timelines=t)
    recs = t.read()["partial"]
    assert len(recs) == work.ctas * 2
    assert sorted(r["program"] for r in recs) == list(range(work.ctas * 2))
    assert all(r["sm"] >= 0 and 0 < r["start_ns"] <= r["end_ns"] and r["items"] == 1 for r in recs)


@pytest.mark.parametrize("graph", [False, True])
def test_a_plan_runs_it_eager_and_replayed(graph):
    rng = random.Random(5)
    B, heads = 8, 96
    x = mla_inputs(B, heads, 576, 9000, page_size=64, dtype=torch.bfloat16, device="cuda", seed=11)
    p = MLADecodePlan(heads, 576, 512, 64, dtype=torch.bfloat16, device="cuda", max_batch=B, use_cuda_graph=graph)
    assert p._ws
    out = torch.empty(B, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, heads, dtype=torch.float32, device="cuda")
    replay_plan(p, (x["q"], x["kv_cache"], x["block_table"]), out, lse, graph, random_steps(rng, B, 9000),
                lambda lens: _ref(x, lens))
    if not graph:  # the later eager runs bypassed Gluon's binding (kernels.bound_launch), checked above all the same
        assert sum(b.hits for b in ws._BOUND.values()) > 0


def test_bound_launches_encode_each_tensors_descriptors():
    """A plan's bound Gluon launches keep each TMA descriptor's encoding by its base, shape and strides
    (``bound_launch._TmaLaunch``): eager runs that alternate two caches and two queries (one a view of a larger
    buffer: another base and strides) each match their own fp64 reference, NaN-filled outputs between."""
    from splitlab.kernels import bound_launch

    B, heads, lens = 4, 128, [65, 3000, 1, 700]
    xs = [mla_inputs(B, heads, 576, 3000, page_size=64, dtype=torch.bfloat16, device="cuda", seed=s) for s in (1, 2)]
    wide = torch.randn(B, heads, 640, dtype=torch.bfloat16, device="cuda")
    wide[..., :576] = xs[1]["q"]
    xs.append(dict(xs[1], q=wide[..., :576]))  # q's rows 640 apart: another base and row stride, xs[1]'s cache
    p = MLADecodePlan(heads, 576, 512, 64, dtype=torch.bfloat16, device="cuda", max_batch=B)
    assert p._ws
    p.plan(lens)
    out = torch.empty(B, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, heads, dtype=torch.float32, device="cuda")
    for x in (xs[0], xs[1], xs[0], xs[2], xs[1], xs[0]):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        p.run(x["q"], x["kv_cache"], x["block_table"], out=out, lse=lse)
        torch.cuda.synchronize()
        ref, ref_lse = _ref(x, lens)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [])
    tma = [hit[2] for b in ws._BOUND.values() for hit in b._compiled.values() if hit[2] is not None]
    assert bound_launch.KEEP_TMA and tma and max(len(t.encoded) for t in tma) >= 4  # 2 caches, 3 queries (the first
    # call, Triton's, encodes its own)


# --- MQA (kernels.mqa_sm90_ws) -----------------------------------------------------------------------------------


def _gqa_ref(x, lens):
    return reference.gqa_decode(x["q"], x["k_cache"], x["v_cache"], x["block_table"], torch.tensor(lens),
                                return_lse=True)


def _mqa_work(heads, lens, page):
    w = DecodeWorkload(kind="gqa", batch=len(lens), num_q_heads=heads, num_kv_heads=1, head_dim_qk=128,
                       head_dim_v=128, ctx_len=max(lens), page_size=page, dtype="bf16", seq_lens=tuple(lens))
    return WorkList.from_schedule(S.splitlab(w, devices.get("h200"), persistent=False), "cuda")


@pytest.mark.parametrize("heads,page", [(128, 16), (64, 16), (128, 64)])
def test_the_mqa_scheduled_launcher_runs_it_and_matches_fp64(heads, page, monkeypatch):
    x = gqa_inputs(len(LENS), heads, 1, 128, LENS, page_size=page, dtype=torch.bfloat16, device="cuda", seed=heads)
    work = _mqa_work(heads, LENS, page)
    assert mqa_ws.use_ws(torch.bfloat16, heads, 1, 128, (64, 8 if heads == 128 else 4, 3), page, x["q"].device,
                         False, work.schedule.align)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    out, lse = gqa_decode_scheduled(*args, work, return_lse=True)
    ref, ref_lse = _gqa_ref(x, LENS)
    assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [0])
    t = Timelines()
    gqa_decode_scheduled(*args, work, timelines=t)
    recs = t.read()["partial"]
    assert len(recs) == work.ctas and all(r["sm"] >= 0 and 0 < r["start_ns"] <= r["end_ns"] for r in recs)
    monkeypatch.setattr(mqa_ws, "ENABLED", False)  # the tl tile on the same work list
    assert rel_err(out, gqa_decode_scheduled(*args, work).double()) < 5e-3


@pytest.mark.parametrize("graph", [False, True])
def test_an_mqa_plan_runs_it_eager_and_replayed(graph):
    rng = random.Random(7)
    B, heads = 8, 128
    x = gqa_inputs(B, heads, 1, 128, 9000, page_size=16, dtype=torch.bfloat16, device="cuda", seed=13)
    p = GQADecodePlan(heads, 1, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=B, use_cuda_graph=graph)
    assert p._ws
    out = torch.empty(B, heads, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, heads, dtype=torch.float32, device="cuda")
    replay_plan(p, (x["q"], x["k_cache"], x["v_cache"], x["block_table"]), out, lse, graph,
                random_steps(rng, B, 9000), lambda lens: _gqa_ref(x, lens))
    if not graph:
        assert sum(b.hits for b in mqa_ws._BOUND.values()) > 0


@pytest.mark.parametrize("heads,page", [(128, 16), (64, 64)])
def test_the_persistent_mqa_kernel_switched_on_matches_fp64(heads, page, monkeypatch):
    """``PERSISTENT_ENABLED`` on (as its A/B would ship it): the scheduled launcher on stream-K schedules (several
    items a slot, an empty request among them) and a stream-K plan, eager and replayed in a graph over new lengths,
    against fp64."""
    monkeypatch.setattr(mqa_ws, "PERSISTENT_ENABLED", True)
    x = gqa_inputs(len(LENS), heads, 1, 128, LENS, page_size=page, dtype=torch.bfloat16, device="cuda", seed=heads)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"])
    ref, ref_lse = _gqa_ref(x, LENS)
    for ctas in (3, 7):
        out, lse = gqa_decode_scheduled(*args, WorkList.from_schedule(S.stream_k(LENS, ctas), "cuda"),
                                        return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [0])
    rng = random.Random(heads + page)
    B = 8
    y = gqa_inputs(B, heads, 1, 128, 9000, page_size=page, dtype=torch.bfloat16, device="cuda", seed=14)
    for graph in (False, True):
        p = GQADecodePlan(heads, 1, 128, page, dtype=torch.bfloat16, device="cuda", scheduler="stream_k", ctas=40,
                          max_batch=B, use_cuda_graph=graph)
        assert p._ws
        out = torch.empty(B, heads, 128, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, heads, dtype=torch.float32, device="cuda")
        replay_plan(p, (y["q"], y["k_cache"], y["v_cache"], y["block_table"]), out, lse, graph,
                    random_steps(rng, B, 9000), lambda lens: _gqa_ref(y, lens))
