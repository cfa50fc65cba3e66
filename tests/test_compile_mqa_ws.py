"""The warp-specialized MQA work-list kernel (``kernels.mqa_sm90_ws``) compiles for sm_90a on this CPU machine without
launching (``tests/sm90.py``'s stand-in driver; Gluon does not run under the interpreter): MQA-128 and MQA-64, page
16, 32, 64 and 128, bf16 and fp16, 2 and 3 stages, each with no register spills, shared memory within the 227 KiB an
SM lends a block, no wgmma that ptxas serialises (its C7514 and C7515 warnings: the Gluon MQA tile of
``experiments/frontier_ab`` lost its overlap to C7514), the partitions' setmaxnreg and the wgmma its loop implies;
the persistent build (``launch``'s ``cta_offsets``: a program walks its slot's items) on a stream-K schedule of
several items a slot, at 128 and 64 heads, page 16 and 64, bf16 and fp16, 2 and 3 stages, bounded + timeline.

Its results are checked only on the H200 (``experiments/mqa_ws/ab.py`` checks it against the fp64 reference before
timing it); ``test_mqa_ws_scope.py`` has what the launcher refuses."""

from __future__ import annotations

import pytest
from sm90 import WS_CHECKS, compile_in_child

from splitlab.kernels import mqa_sm90_ws as ws

SCRIPT = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.mla_sm90_ws as mla_ws
import splitlab.kernels.mqa_sm90_ws as ws
from splitlab.kernels.inputs import gqa_inputs
from splitlab.kernels.mla import SMEM_BUDGET
from splitlab.kernels.timeline import Timelines
from splitlab.kernels.worklist import WorkList, alloc_partials
from splitlab.planners import schedulers

ws._mqa_ws_kernel = Warmup(ws._mqa_ws_kernel)
launch_common.check_launch_device = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched


def case(heads, page, dtype, stages, plan=False, persistent=False):
    # one item a slot: two requests, one split in two (partial rows), one direct; persistent: a stream-K schedule of
    # three requests (one empty) over two slots, a slot walking several items
    lens = [300, 70, 0] if persistent else [300, 70]
    x = gqa_inputs(len(lens), heads, 1, 128, lens, page_size=page, dtype=dtype)
    s = schedulers.stream_k(lens, 2) if persistent else schedulers.uniform(lens, 2)
    work = ws.check_launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], WorkList.from_schedule(s, "cpu"),
                           stages, persistent)
    po, pl = alloc_partials(work, heads, 128, "cpu")
    extra = 2 * bool(plan)  # a plan's launch: a capacity grid (BOUNDED) with a recorded timeline
    slots = work.ctas + extra
    offsets = torch.cat([work.cta_offsets, work.cta_offsets[-1:].repeat(extra)]) if persistent else None
    ws.launch(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work.items, slots,
              torch.empty(len(lens), heads, 128, dtype=dtype), torch.empty(len(lens), heads), po, pl, 0.1, stages,
              num_ctas=torch.tensor([work.ctas], dtype=torch.int32) if plan else None,
              timeline=Timelines(hold_start=plan == "hold").args("partial", slots, "cpu") if plan else None,
              cta_offsets=offsets)


CASES = [(h, p, d, 2) for h in (128, 64) for p in (16, 64) for d in (torch.bfloat16, torch.float16)] + [
    (128, 32, torch.bfloat16, 2), (128, 128, torch.bfloat16, 2), (128, 16, torch.bfloat16, 3),
    (128, 64, torch.float16, 3), (64, 16, torch.bfloat16, 3), (128, 16, torch.bfloat16, 2, True),
    (128, 16, torch.bfloat16, 2, "hold")]  # plan "hold": the timeline's start held to the end (HOLD_START)
# The persistent build: 128 and 64 heads at page 16 and 64 (bf16; fp16 and 3 stages once each), bounded + timeline
# at both head counts (a capacity grid's slots past the count exit before they read their CTA offsets).
CASES += [(h, p, torch.bfloat16, 2, False, True) for h in (128, 64) for p in (16, 64)] + [
    (128, 64, torch.float16, 2, False, True), (128, 16, torch.bfloat16, 3, False, True),
    (64, 64, torch.float16, 3, False, True), (128, 16, torch.bfloat16, 2, True, True),
    (64, 64, torch.bfloat16, 2, True, True)]


def name(heads, page, dtype, stages, plan=False, persistent=False):
    return (("persistent " if persistent else "") + f"MQA-{heads} page {page} {str(dtype)[6:]} stages {stages}"
            + (", bounded + timeline" if plan else "") + (", held start" if plan == "hold" else ""))


# One consumer body a warpgroup that runs one (64 heads: consumer 0 only; the persistent build's item loop holds one
# body too): QK as two m64n64k16 chains of 4 (k = 128), PV one m64n128k16 chain of 4 (64 keys). C751x: C7514 (an
# accumulator in flight across iterations), C7515, ...
sys.exit(1 if check_ws([(name(*c), lambda c=c: case(*c), {mla_ws.CONSUMER_REGS, mla_ws.LOADER_REGS},
                         {64: 8 * (c[0] // 64), 128: 4 * (c[0] // 64)}) for c in CASES], SMEM_BUDGET, r"C751\d") else 0)
"""


@pytest.mark.skipif(not ws.HAVE_GLUON, reason="needs triton 3.6's Gluon")
def test_compiles_for_sm90a_without_spills():
    r = compile_in_child(WS_CHECKS + SCRIPT)
    print(r.stdout)
