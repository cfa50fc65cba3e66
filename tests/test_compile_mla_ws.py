"""The warp-specialized MLA work-list kernel (``kernels.mla_sm90_ws``) compiles for sm_90a on this CPU machine, every
variant, without launching (``tests/sm90.py``'s stand-in driver; Gluon does not run under the interpreter): no
register spills, shared memory within the 227 KiB an SM lends a block, no wgmma that ptxas serialises (its C7515
warning), the partitions' register counts within the SM's file, and the wgmma the schedule implies; the persistent
seesaw (``seesaw-persistent``) on a stream-K schedule of several items a slot, at 128 and 64 heads, bf16 and fp16,
page 64 and 128.

Its results are checked only on the H200 (``experiments/mla_ws/ab.py`` checks every variant against the fp64
reference before timing it); ``test_mla_ws_scope.py`` has what the launcher refuses."""

from __future__ import annotations

import pytest
from sm90 import WS_CHECKS, compile_in_child

from splitlab.kernels import mla_sm90_ws as ws

SCRIPT = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.mla_sm90_ws as ws
from splitlab.kernels.inputs import mla_inputs
from splitlab.kernels.mla import SMEM_BUDGET
from splitlab.kernels.timeline import Timelines
from splitlab.kernels.worklist import WorkList, alloc_partials
from splitlab.planners import schedulers

ws._mla_ws_kernel = Warmup(ws._mla_ws_kernel)
launch_common.check_launch_device = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched


def case(variant, heads, page, dtype, bounded=False, timeline=False):
    # one-item variants: two requests, one split in two, one direct; persistent ones: a stream-K schedule of three
    # requests (one empty) over two slots, a slot walking several items
    persistent = variant in ws.PERSISTENT_VARIANTS
    lens = [300, 70, 0] if persistent else [300, 70]
    x = mla_inputs(len(lens), heads, 576, lens, page_size=page, dtype=dtype)
    s = schedulers.stream_k(lens, 2) if persistent else schedulers.uniform(lens, 2, request_major=True)
    work = ws.check_launch(x["q"], x["kv_cache"], x["block_table"], WorkList.from_schedule(s, "cpu"), variant, 512)
    po, pl = alloc_partials(work, heads, 512, "cpu")
    tiles = -(-heads // 64)
    slots = work.ctas + 2 * bounded
    offsets = torch.cat([work.cta_offsets, work.cta_offsets[-1:].repeat(2 * bounded)]) if persistent else None
    ws.launch(x["q"], x["kv_cache"], x["block_table"], work.items, slots,
              torch.empty(len(lens), heads, 512, dtype=dtype), torch.empty(len(lens), heads), po, pl, 0.1, variant,
              num_ctas=torch.tensor([work.ctas], dtype=torch.int32) if bounded else None,
              timeline=Timelines(hold_start=timeline == "hold").args("partial", slots * tiles, "cpu") if timeline
              else None, cta_offsets=offsets)


# name, variant, heads, page, dtype; (QK m64n64k16, PV m64n256k16) wgmma in the code: recompute runs its loop body
# in both consumers (2 x 36 QK, 2 x 4 PV); seesaw has three QK sites (consumer 0's step, its odd last step,
# consumer 1's step) and six PV GEMMs (two a full step in each consumer, one in each odd last step).
CASES = [(f"{v} 128/576 bf16 page 64", v, 128, 64, torch.bfloat16) for v in ws.VARIANTS] + [
    ("seesaw-fine 64/576 fp16 page 128", "seesaw-fine", 64, 128, torch.float16),
    ("recompute 16/576 bf16 page 64", "recompute", 16, 64, torch.bfloat16),
    ("seesaw-persistent 16/576 bf16 page 64", "seesaw-persistent", 16, 64, torch.bfloat16),  # MLA-16, padded rows
] + [  # the persistent seesaw at the other head counts, dtypes and pages (128 / bf16 / 64 above)
    (f"{v} {h}/576 {n} page {p}", v, h, p, d) for v in sorted(ws.PERSISTENT_VARIANTS)
    for h, p, (n, d) in [(64, 64, ("bf16", torch.bfloat16)), (128, 128, ("fp16", torch.float16)),
                         (64, 128, ("fp16", torch.float16)), (128, 128, ("bf16", torch.bfloat16)),
                         (64, 64, ("fp16", torch.float16))]
]
# A plan's launches: a capacity grid (BOUNDED) and a recorded timeline, at the default variant (and the persistent
# one: a capacity grid's slots past the count exit before they read their CTA offsets).
EXTRA = [("seesaw 128/576 bf16 page 64, bounded + timeline", "seesaw", 128, 64, torch.bfloat16)] + [
    (f"{v} 128/576 bf16 page 64, bounded + timeline", v, 128, 64, torch.bfloat16)
    for v in sorted(ws.PERSISTENT_VARIANTS)]
# The persistent seesaw has the seesaw's GEMM sites (its loop body is the seesaw's step functions).
WGMMA = {"recompute": {64: 72, 256: 8}, "recompute-fine": {64: 72, 256: 8}, "seesaw": {64: 108, 256: 24},
         "seesaw-fine": {64: 108, 256: 24}, "seesaw-persistent": {64: 108, 256: 24}}
REGS = {ws.CONSUMER_REGS, ws.LOADER_REGS, 3 * ws.MAXNREG - ws.CONSUMER_REGS - ws.LOADER_REGS}
RUNS = [(name, lambda a=(v, h, p, d): case(*a), REGS, WGMMA[v]) for name, v, h, p, d in CASES] + [
    (name, lambda a=(v, h, p, d): case(*a, bounded=True, timeline=True), REGS, WGMMA[v]) for name, v, h, p, d in EXTRA]
RUNS += [("seesaw 128/576 bf16 page 64, bounded + timeline, held start",  # the start held to the end (HOLD_START)
          lambda: case("seesaw", 128, 64, torch.bfloat16, bounded=True, timeline="hold"), REGS, WGMMA["seesaw"])]
sys.exit(1 if check_ws(RUNS, SMEM_BUDGET) else 0)
"""


@pytest.mark.skipif(not ws.HAVE_GLUON, reason="needs triton 3.6's Gluon")
def test_every_variant_compiles_for_sm90a_without_spills():
    r = compile_in_child(WS_CHECKS + SCRIPT)
    print(r.stdout)


def test_the_partitions_registers_fit_the_register_file():
    # 12 warps (the producer's warp is padded to a warpgroup) at MAXNREG each at launch; setmaxnreg then moves
    # registers between the three warpgroups, which must not ask for more than the launch holds (a warpgroup whose
    # increase cannot be met waits for ever), nor may the launch ask more than the SM's 65536.
    assert 12 * 32 * ws.MAXNREG <= 65536
    default = 3 * ws.MAXNREG - ws.CONSUMER_REGS - ws.LOADER_REGS
    assert 24 <= ws.LOADER_REGS <= default <= 256 and ws.CONSUMER_REGS <= 256
    assert all(r % 8 == 0 for r in (ws.CONSUMER_REGS, ws.LOADER_REGS, default))
