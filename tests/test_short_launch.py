"""The GQA work-list path's two short-launch variants (``kernels.worklist``; issue 37, ``experiments/short_launch``):
the fused merge (``fused_merge=True``) against the fp64 reference under Triton's interpreter, its counters back at
0 after every launch; programmatic dependent launch (``pdl=``) as the plain launch there; the refusals; and both
variants compiled for sm_90a, the plain build free of their instructions."""

from __future__ import annotations

import pytest
import torch
from sm90 import compile_in_child

from splitlab.errors import SplitlabError
from splitlab.kernels import reference, workitems, worklist
from splitlab.kernels.accuracy import assert_matches_reference, assert_same_nonfinite
from splitlab.kernels.inputs import gqa_inputs, poison_unread_pages_, set_key_
from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled
from splitlab.planners import schedulers as S


def schedules(lens: list[int], page_size: int) -> list:
    """One item a request (every request written directly), few and many partials a request, persistent slots."""
    return [S.uniform(lens, 1), S.uniform(lens, 2), S.uniform(lens, 9), S.stream_k(lens, 3), S.balanced(lens, 7),
            S.flashinfer(lens, page_size=page_size, num_kv_heads=2, sm_count=4)]


# (dtype, B, Hq, Hkv, D, lens, page_size, block_n): odd groups and head dims, empty requests, a 1-key request
CASES = [
    (torch.float32, 4, 6, 2, 24, [130, 0, 17, 64], 16, 32),
    (torch.float16, 3, 5, 1, 16, [200, 1, 65], 64, 64),
    (torch.bfloat16, 2, 8, 2, 32, [0, 0], 16, 32),
]


@pytest.mark.parametrize("dtype,B,Hq,Hkv,D,lens,page_size,block_n", CASES)
def test_fused_merge_matches_reference_and_leaves_counters_zero(allocs, dtype, B, Hq, Hkv, D, lens, page_size,
                                                                 block_n):
    x = gqa_inputs(B, Hq, Hkv, D, lens, page_size=page_size, dtype=dtype, seed=7 * B + D)
    poison_unread_pages_(x["k_cache"], x["block_table"], lens, page_size)
    poison_unread_pages_(x["v_cache"], x["block_table"], lens, page_size)
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    empty = [b for b, n in enumerate(lens) if n == 0]
    counters = torch.zeros(B, Hkv, dtype=torch.int32)
    for s in schedules(lens, page_size):
        bn = block_n if page_size % block_n or s.align % block_n == 0 else 16
        work = WorkList.from_schedule(s, "cpu")
        for fused_counters in (counters, None):  # one buffer over every launch, and the launcher's own
            allocs.clear()
            out, lse = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, block_n=bn,
                                            return_lse=True, fused_merge=True, counters=fused_counters)
            assert_matches_reference(out, lse, ref, ref_lse, dtype, empty)
            assert not torch.isnan(allocs[0]).any() and not torch.isnan(allocs[1]).any(), s.scheduler
            assert counters.eq(0).all(), (s.scheduler, counters)


def test_fused_merge_a_nan_key_reaches_its_request_only():
    lens = [300, 90, 41]
    x = gqa_inputs(3, 4, 2, 16, lens, dtype=torch.float32, seed=5)
    set_key_(x["k_cache"], x["block_table"], 0, 250, float("nan"))
    ref, ref_lse = reference.gqa_decode(**x, return_lse=True)
    for s in (S.stream_k(lens, 3), S.uniform(lens, 4)):
        out, lse = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                        WorkList.from_schedule(s, "cpu"), return_lse=True, fused_merge=True)
        assert_same_nonfinite(out, ref, torch.float32)
        assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all()
        assert not torch.isnan(out[1:]).any() and torch.isfinite(lse[1:]).all()


def test_fused_merge_row_merge_equals_the_merge_kernel():
    """The fused merge (one row a step, a group a step) and ``launch_merge`` (``combine.merge_splits``) agree to
    fp32 rounding on the same partial rows; the fused launch launches no merge kernel."""
    lens = [500, 333, 2]
    x = gqa_inputs(3, 8, 2, 32, lens, page_size=16, dtype=torch.float32, seed=11)
    work = WorkList.from_schedule(S.uniform(lens, 12), "cpu")
    launched: list[str] = []
    real = worklist.launch_merge

    def spy(*a, **kw):
        launched.append("merge")
        return real(*a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worklist, "launch_merge", spy)
        plain = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, return_lse=True)
        assert launched == ["merge"]
        fused = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, return_lse=True,
                                     fused_merge=True)
        assert launched == ["merge"]
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


class _Spy:
    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def run(*a, **kw):
            self.seen.append(set(kw))
            return self.kernel[grid](*a, **kw)
        return run


VARIANT_ARGS = {"LAUNCH_DEPENDENTS", "WAIT_PRIOR", "launch_pdl", "FUSED", "offsets_ptr", "counters_ptr"}


def test_plain_launch_passes_no_variant_argument_and_pdl_is_the_plain_launch_here(monkeypatch):
    """The plain launch passes none of the variants' arguments (its compiled code is the one before they existed);
    under the interpreter ``pdl=`` runs those same launches, bit for bit."""
    seen: list = []
    for mod, name in ((worklist, "_gqa_worklist_kernel"), (workitems, "_merge_kernel")):
        monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), seen))
    lens = [100, 40, 0]
    x = gqa_inputs(3, 4, 2, 16, lens, page_size=16, dtype=torch.float32, seed=2)
    work = WorkList.from_schedule(S.uniform(lens, 3), "cpu")
    plain = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, return_lse=True)
    assert len(seen) == 2 and not any(kw & VARIANT_ARGS for kw in seen)
    for trigger in worklist.PDL_TRIGGERS:
        seen.clear()
        out = gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, return_lse=True,
                                   pdl=trigger)
        assert len(seen) == 2 and not any(kw & VARIANT_ARGS for kw in seen)
        assert all(torch.equal(a, b) for a, b in zip(plain, out, strict=True))
    seen.clear()
    gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, fused_merge=True)
    assert len(seen) == 1 and {"FUSED", "offsets_ptr", "counters_ptr"} <= seen[0]


def test_refusals_are_one_line(monkeypatch):
    lens = [100, 5]
    x = gqa_inputs(2, 4, 2, 16, lens, page_size=64, dtype=torch.float32)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"], WorkList.from_schedule(S.uniform(lens, 2), "cpu"))
    for kw, match in (
        (dict(pdl="middle"), "pdl='middle' is not allowed"),
        (dict(pdl=True), "pdl=True is not allowed"),
        (dict(pdl="end", fused_merge=True), "no merge kernel to overlap"),
        (dict(fused_merge=1), "fused_merge=1 is not allowed"),
        (dict(counters=torch.zeros(2, 2, dtype=torch.int32)), "only with fused_merge=True"),
        (dict(fused_merge=True, counters=torch.zeros(2, 2, dtype=torch.int64)), "counters has dtype"),
        (dict(fused_merge=True, counters=torch.zeros(2, 3, dtype=torch.int32)), r"expected a contiguous \[2, 2\]"),
        (dict(fused_merge=True, counters=torch.zeros(2, 2, dtype=torch.int32).t()), "expected a contiguous"),
        (dict(fused_merge=True, counters=torch.zeros(4, dtype=torch.int32)), "expected 2 dimensions"),
    ):
        with pytest.raises(SplitlabError, match=match) as e:
            gqa_decode_scheduled(*args, **kw)
        assert "\n" not in str(e.value)
    monkeypatch.setattr(worklist, "PDL_AVAILABLE", False)
    with pytest.raises(SplitlabError, match=r"needs triton.language.extra.cuda.gdc_wait \(triton >= 3.4\)"):
        gqa_decode_scheduled(*args, pdl="start")


COMPILE_SCRIPT = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.gqa as gqa
import splitlab.kernels.worklist as wl
from splitlab.kernels.inputs import gqa_inputs
from splitlab.planners import schedulers as S

wl._gqa_worklist_kernel = Warmup(wl._gqa_worklist_kernel)
import splitlab.kernels.workitems as wi
wi._merge_kernel = Warmup(wi._merge_kernel)
gqa._check_inputs = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched
launch_common.check_launch_device = lambda *a: None
launch_common.INTERPRET = False  # the GPU build (check_pdl)


def code(ptx):  # the instructions, less debug sections and line records
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    return [ln for ln in ptx.splitlines() if ln.strip() and not ln.lstrip().startswith((".loc", ".file", "//"))]


FUSED_ATOM = "atom.global.gpu.acq_rel.add"
lens = [100, 7, 0]
x = gqa_inputs(3, 32, 8, 128, lens, page_size=16, dtype=torch.bfloat16)
mqa = gqa_inputs(3, 128, 1, 128, lens, page_size=64, dtype=torch.bfloat16)
failed = []
for label, s in (("one item", S.uniform(lens, 4)), ("persistent", S.stream_k(lens, 3))):
    work = wl.WorkList.from_schedule(s, "cpu")
    for name, t in (("gqa 32/8", x), ("mqa-128", mqa)):
        def launch(**kw):
            n0 = len(compiled)
            wl.gqa_decode_scheduled(t["q"], t["k_cache"], t["v_cache"], t["block_table"], work, **kw)
            return compiled[n0:]
        plain_p, plain_m = launch()
        for k in (plain_p, plain_m):
            p = k.asm["ptx"]
            if "griddepcontrol" in p or "atom." in p or k.metadata.launch_pdl:
                failed.append(f"PLAIN {name} {label}: griddepcontrol, an atomic or launch_pdl in the plain build")
        for trigger in wl.PDL_TRIGGERS:
            part, merge = launch(pdl=trigger)
            pp, mp = part.asm["ptx"], merge.asm["ptx"]
            if pp.count("griddepcontrol.launch_dependents") != 1 or "griddepcontrol.wait" in pp:
                failed.append(f"PDL {name} {label} {trigger}: the partial kernel's trigger")
            if mp.count("griddepcontrol.wait") != 1 or not merge.metadata.launch_pdl or part.metadata.launch_pdl:
                failed.append(f"PDL {name} {label} {trigger}: the merge's wait / launch_pdl")
            # the variant adds its instruction and nothing else to the plain code
            for plain, var, what in ((plain_p, part, "partial"), (plain_m, merge, "merge")):
                extra = len(code(var.asm["ptx"])) - len(code(plain.asm["ptx"]))
                if not 0 < extra <= 8:
                    failed.append(f"PDL {name} {label} {trigger} {what}: {extra} more lines than the plain build")
        got = launch(fused_merge=True)
        if len(got) != 1:
            failed.append(f"FUSED {name} {label}: {len(got)} kernels compiled; expected the partial kernel alone")
        fp = got[0].asm["ptx"]
        before, _, after = fp.partition(FUSED_ATOM)
        if not after or fp.count(FUSED_ATOM) != 1:
            failed.append(f"FUSED {name} {label}: {fp.count(FUSED_ATOM)} x {FUSED_ATOM}; expected one")
        elif "bar.sync" not in before.rsplit("st.global", 1)[-1] or "bar.sync" not in after.split("ld.global")[0]:
            failed.append(f"FUSED {name} {label}: no bar.sync between the row's stores, the atomic and the loads")
        print(f"ok {name} {label}: plain {usage(plain_p)}, fused {usage(got[0])}; shared "
              f"{plain_p.metadata.shared} / {got[0].metadata.shared} B")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_variants_compile_for_sm90_and_stay_out_of_the_plain_build():
    """sm_90a: the plain partial and merge hold no griddepcontrol, no atomic, no launch_pdl; ``pdl=`` adds one
    launch_dependents to the partial kernel and one wait to the merge (launched with launch_pdl), a few lines each;
    the fused merge compiles one kernel with one ``atom.acq_rel.gpu`` between barriers (after the row's stores,
    before the rows' loads)."""
    r = compile_in_child(COMPILE_SCRIPT)
    print(r.stdout)
