"""Plan once, run every layer (``kernels.decode_plan``), under Triton's interpreter: ``run()`` against the fp64
reference for several schedulers, batches and dtypes (empty requests, ragged, a batch of only empty requests), with
every buffer the plan and run allocate poisoned; the buffers reused across plans (same addresses); a CUDA graph's
replay emulated on the CPU (the launches recorded at one plan, replayed as recorded after another); no host sync in
``run()``; and every refusal in one line."""

from __future__ import annotations

import pytest
import torch
from sm90 import WORKLIST
from triton.runtime.jit import KernelInterface

from splitlab.devices import get as get_device
from splitlab.errors import SplitlabError
from splitlab.kernels import _launch, gqa_decode, reference
from splitlab.kernels import worklist as wl
from splitlab.kernels.accuracy import assert_matches_reference
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, poison_unread_pages_
from splitlab.planners import schedulers as S

REAL_GETITEM = KernelInterface.__getitem__


@pytest.fixture
def launches(monkeypatch):
    """Kernel launches recorded, not run: ``(kernel, grid, args, kwargs)`` each (``replay`` runs one for real)."""
    calls: list = []
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *a, **kw: calls.append((self, grid, a, kw)))
    return calls


def replay(calls: list) -> None:
    """Run recorded launches as recorded: the grids, pointers and constexprs a captured CUDA graph holds."""
    for kernel, grid, args, kwargs in calls:
        REAL_GETITEM(kernel, grid)(*args, **kwargs)


def gqa_case(lens, dtype=torch.float32, hq=6, hkv=2, d=32, page=16, seed=0):
    x = gqa_inputs(len(lens), hq, hkv, d, lens, page_size=page, dtype=dtype, seed=seed)
    poison_unread_pages_(x["k_cache"], x["block_table"], lens, page)
    poison_unread_pages_(x["v_cache"], x["block_table"], lens, page)
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    return x, ref, ref_lse


def run_gqa(p, x, **kw):
    return p.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], **kw)


def empty_rows(lens):
    return [b for b, n in enumerate(lens) if n == 0]


# (scheduler, knobs) x graph: every scheduler the family takes
GQA_SCHEDULERS = [("splitlab", {}), ("uniform", dict(num_splits=3)), ("balanced", dict(ctas=7)),
                  ("stream_k", dict(ctas=4)), ("flashinfer", {})]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("scheduler,knobs", GQA_SCHEDULERS, ids=[s for s, _ in GQA_SCHEDULERS])
def test_gqa_run_matches_reference(allocs, graph, scheduler, knobs):
    lens = [130, 0, 17, 64]
    x, ref, ref_lse = gqa_case(lens, seed=1)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler=scheduler, use_cuda_graph=graph,
                      max_batch=4, max_ctas=16, max_items=24, **knobs)
    s = p.plan(lens)
    assert s.scheduler == scheduler or (scheduler == "splitlab" and s.params["chosen_by"] == "splitlab")
    out, lse = run_gqa(p, x, return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, empty_rows(lens))
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()  # the poisoned outputs are fully written


@pytest.mark.parametrize("dtype,hq,hkv,d,page,lens", [
    (torch.float16, 4, 1, 16, 64, [200, 1, 65]),  # MQA, tiles inside a page
    (torch.bfloat16, 8, 2, 32, 16, [0, 0]),  # only empty requests
    (torch.bfloat16, 8, 8, 16, 1, [40, 3, 0, 90, 7]),  # MHA, one key a page
])
def test_gqa_dtypes_and_empty_batches(allocs, dtype, hq, hkv, d, page, lens):
    x, ref, ref_lse = gqa_case(lens, dtype, hq, hkv, d, page, seed=len(lens))
    for graph in (False, True):
        p = GQADecodePlan(hq, hkv, d, page, dtype=dtype, device="cpu", use_cuda_graph=graph, max_ctas=32,
                          max_items=32)
        p.plan(lens)
        out, lse = run_gqa(p, x, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, dtype, empty_rows(lens))
        out2 = run_gqa(p, x, out=torch.full_like(out, float("nan")))  # a given out, fully written too
        assert torch.equal(out2, out)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("scheduler", ["splitlab", "flashmla", "stream_k"])
def test_mla_run_matches_reference(allocs, graph, scheduler):
    lens = [150, 0, 64, 1]
    x = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    poison_unread_pages_(x["kv_cache"], x["block_table"], lens, 64)
    ref, ref_lse = reference.mla_decode(**x, head_dim_v=64, return_lse=True)
    p = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler=scheduler, use_cuda_graph=graph,
                      max_batch=4, max_ctas=140, max_items=140, max_partial_rows=16)
    p.plan(lens)
    out, lse = p.run(x["q"], x["kv_cache"], x["block_table"], return_lse=True)
    assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


def test_pdl_plans_run_the_plain_launches_here(launches):
    """``pdl=True`` (programmatic dependent launch of the merge after the tl tile) is a GPU launch option: under the
    interpreter a pdl plan launches exactly what the plain plan launches (worklist.check_pdl), GQA and MLA, eager and
    graph; a non-bool is refused in one line. What it adds to the compiled code: test_pdl_plans_compile_for_sm90."""
    lens = [130, 0, 17, 64]
    x, _, _ = gqa_case(lens, seed=2)
    xm = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=2)
    for graph in (False, True):
        seen = []
        for pdl in (False, True):
            gp = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=3,
                               use_cuda_graph=graph, pdl=pdl)
            mp = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler="uniform",
                               num_splits=3, use_cuda_graph=graph, pdl=pdl)
            assert gp.pdl is False and mp.pdl is False
            gp.plan(lens)
            mp.plan(lens)
            launches.clear()
            run_gqa(gp, x)
            mp.run(xm["q"], xm["kv_cache"], xm["block_table"])
            seen.append([(k, g, sorted(kw)) for k, g, _, kw in launches])
        assert seen[0] == seen[1] and len(seen[0]) == 4
    for bad_pdl in (1, "start", None):
        with pytest.raises(SplitlabError, match=f"pdl={bad_pdl!r} is not allowed") as e:
            GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", pdl=bad_pdl)
        one_line(e)


def test_plan_equals_the_launchers():
    """A plan of scheduler uniform at S splits gives gqa_decode's result at num_splits=S (same math, the keys cut
    at other tiles), and mla_decode_scheduled's on the same schedule exactly."""
    lens = [300, 5, 0, 129]
    x, ref, _ = gqa_case(lens, seed=7)
    for s in (1, 2, 5):
        p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=s)
        p.plan(lens)
        torch.testing.assert_close(run_gqa(p, x), gqa_decode(**x, num_splits=s), rtol=2e-6, atol=2e-6)
    xm = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    p = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler="stream_k", ctas=5)
    s = p.plan(lens)
    want = wl.mla_decode_scheduled(xm["q"], xm["kv_cache"], xm["block_table"], wl.WorkList.from_schedule(s, "cpu"),
                                   head_dim_v=64)
    assert torch.equal(p.run(xm["q"], xm["kv_cache"], xm["block_table"]), want)


def test_plans_reuse_the_buffers(allocs):
    """Plan A, run; plan B (other lengths, a smaller batch), run; plan A again: the same buffers (addresses) every
    time, each result the reference's."""
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", max_batch=5, max_ctas=40, max_items=40,
                      use_cuda_graph=True)
    buffers = None
    for lens in ([130, 0, 17, 64, 9], [400, 33, 1], [0, 0, 0, 0, 0], [130, 0, 17, 64, 9]):
        p.plan(lens)
        now = [t.data_ptr() for t in (p._meta, p._items, p._cta_offsets, p._partial_offsets, p._num_ctas, p._po,
                                      p._pl, p._lse)]
        assert buffers is None or now == buffers
        buffers = now
        x, ref, ref_lse = gqa_case(lens, seed=len(lens))
        out, lse = run_gqa(p, x, return_lse=True)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, empty_rows(lens))


def test_graph_replay_after_a_new_plan(launches):
    """What a CUDA graph does, on the CPU: run() recorded at plan A (grids, pointers, constexprs), a new plan B of the
    same batch (more slots and partial rows, other lengths), the recorded launches replayed: B's result. Without
    use_cuda_graph the grid is A's, and the replay leaves B's extra slots unrun."""
    a, b = [64, 5, 0, 0], [700, 300, 2, 0]  # A: 4 slots, no partial rows; B: 9 slots, 7 partial rows
    x, ref, ref_lse = gqa_case(b, seed=2)  # B's table and caches hold A's keys too
    for graph in (True, False):
        p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="uniform", num_splits=4,
                          use_cuda_graph=graph, max_batch=4, max_ctas=16, max_items=16)
        p.plan(a)
        launches.clear()
        out, lse = torch.full_like(ref, float("nan"), dtype=torch.float32), torch.empty(4, 6)
        run_gqa(p, x, out=out, lse=lse)
        recorded = list(launches)
        sb = p.plan(b)
        assert (p.schedule.ctas, sb.partial_rows) == (9, 7)
        replay(recorded)
        if graph:
            assert len(recorded) == 2  # the partial kernel and the merge (always under use_cuda_graph)
            assert recorded[0][1] == (16 * 2,)  # the capacity's slots x kv heads
            assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [3])
        else:
            assert not torch.allclose(out.double(), ref, equal_nan=True)


def test_run_makes_no_host_sync(monkeypatch, launches):
    """Every way of reading a device value on the host raises while run() launches (its kernels recorded, not run):
    run() reads nothing back, in both modes, checked or not."""
    lens = [130, 0, 17, 64]
    x, _, _ = gqa_case(lens)
    xm = mla_inputs(4, 16, 96, lens, page_size=64, dtype=torch.float32, seed=3)
    plans = []
    for graph in (False, True):
        g = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", use_cuda_graph=graph, max_ctas=16,
                          max_items=16)
        m = MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", use_cuda_graph=graph, max_ctas=16,
                          max_items=16)
        g.plan(lens)
        m.plan(torch.tensor(lens, dtype=torch.int32))  # a tensor: read once here, in plan()
        plans += [(g, (x["q"], x["k_cache"], x["v_cache"], x["block_table"])),
                  (m, (xm["q"], xm["kv_cache"], xm["block_table"]))]

    def sync(*a, **k):
        raise AssertionError("a host read in run()")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "to"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    for p, args in plans:
        for check in (True, False):
            launches.clear()
            p.run(*args, check=check, return_lse=True)
            assert len(launches) in (1, 2)


def test_splitlab_schedule_is_the_schedulers():
    """The plan's splitlab schedule is schedulers.schedule's where the capacity holds all its candidates, and keeps
    within a capacity that does not."""
    lens = [3000, 40, 0, 900, 64, 1]
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", max_batch=6, max_ctas=4096, max_items=4096)
    s = p.plan(lens)
    want = S.schedule(p._workload(lens), get_device("h200"), "splitlab")
    assert s.digest == want.digest
    assert p.plan(torch.tensor(lens)).digest == s.digest  # lengths as a tensor (int64 here): the same plan
    small = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", max_batch=6, max_ctas=8, max_items=8)
    s = small.plan(lens)
    assert s.ctas <= 8 and len(s.items) <= 8
    assert GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu").plan([5]).ctas >= 1  # default capacity


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_refusals_are_one_line():
    lens = [100, 5]
    x, _, _ = gqa_case(lens)
    q, k, v, bt = x["q"], x["k_cache"], x["v_cache"], x["block_table"]

    def plan(**kw):
        return GQADecodePlan(6, 2, 32, 16, **dict(dict(dtype=torch.float32, device="cpu", max_batch=2), **kw))

    p = plan()
    with pytest.raises(SplitlabError, match="run before plan") as e:
        p.run(q, k, v, bt)
    one_line(e)
    with pytest.raises(SplitlabError, match="run before plan"):
        p.run(q, k, v, bt, check=False)
    cases = [
        (lambda: p.plan([1, 2, 3]), "3 requests is past max_batch=2"),
        (lambda: p.plan([]), "at least one request"),
        (lambda: p.plan([5, -1]), r"seq_lens\[1\] = -1"),
        (lambda: p.plan([5, True]), r"seq_lens\[1\] = True"),
        (lambda: p.plan([5, 2.0]), r"seq_lens\[1\] = 2.0"),
        (lambda: p.plan("12"), "expected a list"),
        (lambda: p.plan(torch.zeros(2, 1, dtype=torch.int32)), "1-D int32"),
        (lambda: p.plan(torch.zeros(2)), "1-D int32"),
        (lambda: p.plan(lens, block_table=bt[:, :1]), "past the block table"),
        (lambda: p.plan(lens, block_table=bt, num_pages=1), r"is outside \[0, num_pages = 1\)"),
        (lambda: plan(scheduler="uniform", num_splits=8, max_items=4).plan([1000, 500]), "past max_items=4"),
        (lambda: plan(scheduler="nope"), "scheduler='nope'"),
        (lambda: plan(scheduler="flashmla"), "not allowed for kind gqa"),
        (lambda: plan(scheduler="balanced", num_splits=2), "num-splits is not allowed"),
        (lambda: plan(max_ctas=1), "at least max_batch"),
        (lambda: plan(dtype=torch.int32), "dtype="),
        (lambda: plan(device="meta"), "device is on meta"),
        (lambda: plan(use_cuda_graph=1), "use_cuda_graph=1"),
        (lambda: plan(block_n=48), "block_n=48"),
        (lambda: GQADecodePlan(6, 4, 32, 16, dtype=torch.float32, device="cpu"), "expected a multiple"),
        (lambda: MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", kv_dtype=torch.float8_e4m3fn),
         "beside an"),
        (lambda: MLADecodePlan(16, 96, 64, 64, dtype=torch.float32, device="cpu", scheduler="flashinfer"),
         "not allowed for kind mla"),
        (lambda: plan(block_n=16, scheduler="flashinfer").plan(lens), None),  # page 16, block 16: fits
    ]
    for call, match in cases:
        if match is None:
            call()
            continue
        with pytest.raises(SplitlabError, match=match) as e:
            call()
        one_line(e)
    p.plan(lens)
    runs = [
        (lambda: p.run(q.half(), k, v, bt), "q has dtype torch.float16; expected torch.float32"),
        (lambda: p.run(q, k.half(), v, bt), "k_cache has dtype"),
        (lambda: p.run(q.to("meta"), k, v, bt), "q is on meta; expected the plan's device cpu"),
        (lambda: p.run(q[:1], k, v, bt), r"q has shape \(1, 6, 32\); expected \[2, 6, 32\]"),
        (lambda: p.run(q, k, v, bt.long()), "block_table has dtype torch.int64"),
        (lambda: p.run(q, k, v, bt[:, :1]), "the plan reads up to key 100"),
        (lambda: p.run(q, k[:, :8], v, bt), "k_cache has shape"),
        (lambda: p.run(q, k, v, bt, out=torch.empty(2, 6, 31)), "out has shape"),
        (lambda: p.run(q, k, v, bt, lse=torch.empty(2, 6, dtype=torch.float64)), "lse has dtype"),
        (lambda: p.run(q.clone().requires_grad_(), k, v, bt), "requires grad"),
        (lambda: p.run(list(q), k, v, bt), "q is a list"),
    ]
    for call, match in runs:
        with pytest.raises(SplitlabError, match=match) as e:
            call()
        one_line(e)


def test_eager_plan_refuses_capture(monkeypatch):
    """Without use_cuda_graph, run() refuses a stream being captured (a later plan would change its grid); with it,
    run() goes on (the capture itself is the GPU's test)."""
    from splitlab.kernels import _launch

    lens = [100, 5]
    x, _, _ = gqa_case(lens)
    eager = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", max_ctas=8, max_items=8)
    graph = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", max_ctas=8, max_items=8,
                          use_cuda_graph=True)
    eager.plan(lens)
    graph.plan(lens)
    monkeypatch.setattr(_launch, "capturing", lambda t: True)
    with pytest.raises(SplitlabError, match="use_cuda_graph=True") as e:
        run_gqa(eager, x)
    one_line(e)
    run_gqa(graph, x)


COMPILE = WORKLIST + r"""
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan

work = wl.WorkList.from_schedule(S.uniform(lens, 4), "cpu")
launches = [
    lambda: wl.gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work),
    lambda: wl.mla_decode_scheduled(m["q"], m["kv_cache"], m["block_table"], work),
]
gp = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", scheduler="uniform", num_splits=4,
                   use_cuda_graph=True, max_batch=2, max_ctas=16, max_items=16)
mp = MLADecodePlan(16, 576, 512, 64, dtype=torch.bfloat16, device="cpu", scheduler="uniform", num_splits=4,
                   use_cuda_graph=True, max_batch=2, max_ctas=16, max_items=16)
gp.plan(lens)
mp.plan(lens)
launches += [lambda: gp.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"], check=False),
             lambda: mp.run(m["q"], m["kv_cache"], m["block_table"], check=False)]
parts = []
for launch in launches:
    n0 = len(compiled)
    launch()
    parts.append(compiled[n0])
for plain, bounded in ((parts[0], parts[2]), (parts[1], parts[3])):
    a, b = (plain.metadata.shared, usage(plain)), (bounded.metadata.shared, usage(bounded))
    name = plain.metadata.name
    if a != b:
        print(f"USAGE {name}: launchers' {a}, bounded {b}")
        sys.exit(1)
    print(f"ok {name}: {b}")
"""


PDL_COMPILE = WORKLIST + r"""
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan

launch_common.INTERPRET = False  # the GPU build (worklist.check_pdl)
failed = []
for graph in (False, True):
    runs = {}
    for pdl in (False, True):
        gp = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", scheduler="uniform", num_splits=4,
                           use_cuda_graph=graph, max_batch=2, max_ctas=16, max_items=16, pdl=pdl)
        mp = MLADecodePlan(16, 576, 512, 64, dtype=torch.bfloat16, device="cpu", scheduler="uniform",
                           num_splits=4, use_cuda_graph=graph, max_batch=2, max_ctas=16, max_items=16, pdl=pdl)
        gp.plan(lens)
        mp.plan(lens)
        for name, launch in (("gqa", lambda: gp.run(x["q"], x["k_cache"], x["v_cache"], x["block_table"])),
                             ("mla", lambda: mp.run(m["q"], m["kv_cache"], m["block_table"]))):
            n0 = len(compiled)
            launch()
            runs[name, pdl] = compiled[n0:]
    for name in ("gqa", "mla"):
        (plain_p, plain_m), (part, merge) = runs[name, False], runs[name, True]
        if any("griddepcontrol" in k.asm["ptx"] or k.metadata.launch_pdl for k in (plain_p, plain_m)):
            failed.append(f"PLAIN {name} graph={graph}: griddepcontrol or launch_pdl in the plain build")
        pp, mp_ = part.asm["ptx"], merge.asm["ptx"]
        if pp.count("griddepcontrol.launch_dependents") != 1 or "griddepcontrol.wait" in pp \
                or part.metadata.launch_pdl:
            failed.append(f"PDL {name} graph={graph}: the partial kernel's trigger")
        if mp_.count("griddepcontrol.wait") != 1 or not merge.metadata.launch_pdl:
            failed.append(f"PDL {name} graph={graph}: the merge's wait / launch_pdl")
        if (usage(plain_p), plain_p.metadata.shared) != (usage(part), part.metadata.shared):
            failed.append(f"USAGE {name} graph={graph}: plain {usage(plain_p)}, pdl {usage(part)}")
        print(f"ok {name} graph={graph}: {usage(part)}")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_pdl_plans_compile_for_sm90():
    """sm_90a, GQA and MLA plans (tl tiles), eager and capacity grids: ``pdl=True`` adds one
    ``griddepcontrol.launch_dependents`` to the partial kernel (the registers and shared memory of the plain build)
    and one ``griddepcontrol.wait`` to the merge, launched with ``launch_pdl``; the plain plan's kernels hold
    neither."""
    from sm90 import compile_in_child

    print(compile_in_child(PDL_COMPILE).stdout)


def test_bounded_kernels_compile_for_sm90():
    """The capacity-grid (BOUNDED) work-list kernels compile for sm_90 (an early return is not what the interpreter
    checks) with the registers, stack and shared memory of the launchers' kernels (tests/sm90.py's
    stand-in driver: no GPU, nothing launched)."""
    from sm90 import compile_in_child

    compile_in_child(COMPILE)


def test_plan_on_device_refuses_a_strided_view():
    """The schedule kernel reads seq_lens densely: a column of a wider tensor is refused in one line, not read as
    the wrong lengths."""
    lens = torch.tensor([[130, 9999], [5, 9999]], dtype=torch.int32)
    p = GQADecodePlan(6, 2, 32, 16, dtype=torch.float32, device="cpu", scheduler="balanced", ctas=4, max_batch=2,
                      use_cuda_graph=True, device_schedule=True)
    with pytest.raises(SplitlabError, match=r"contiguous 1-D int32 tensor on cpu .* stride \(2,\)") as e:
        p.plan_on_device(lens[:, 0])
    one_line(e)
    p.plan_on_device(lens[:, 0].contiguous())


def test_device_merge_rows_is_a_waves_rows_a_request(monkeypatch):
    """A device plan's merge tile: the rows a request has when one wave of a head group's slots is dealt over the
    batch, to a power of two, held to [8, 32] (MLA-16's 264 slots over 16 requests: 32; MLA-128's 66: 8; GQA 32/8's 49
    over 8: 8); ``DEVICE_MERGE_ROWS`` overrides it."""
    from splitlab.kernels import decode_plan

    assert [decode_plan.device_merge_rows(b, s) for b, s in ((16, 264), (16, 66), (8, 49), (64, 49), (1, 264),
                                                             (4, 49))] == [32, 8, 8, 8, 32, 16]
    monkeypatch.setattr(decode_plan, "DEVICE_MERGE_ROWS", 4)
    assert decode_plan.device_merge_rows(16, 264) == 4


def test_the_device_guard_switches_only_to_another_gpu(monkeypatch):
    """``_launch.device_guard`` (the plans' and the launchers' guard): none for the CPU or for the current GPU (torch's
    guard costs microseconds a call), torch's guard to another GPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert _launch.device_guard(torch.zeros(1)) is _launch._NO_GUARD
    assert _launch.device_guard(torch.device("cpu")) is _launch._NO_GUARD
    assert _launch.device_guard(torch.device("cuda", 0)) is _launch._NO_GUARD
    g = _launch.device_guard(torch.device("cuda", 1))
    assert isinstance(g, torch.cuda.device) and g.idx == 1
