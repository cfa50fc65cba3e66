"""The kernels compile for a real NVIDIA target (sm_90) on this CPU machine, without launching.

The interpreter accepts code that NVIDIA compilation rejects (non-constexpr globals, small ``tl.dot``
shapes, ...), so a child process without ``TRITON_INTERPRET`` gives Triton a stand-in driver that only
names the target, and ``JITFunction.warmup`` runs the whole pipeline through ptxas (bundled with the
triton wheel). The 16-bit configurations must not spill registers, and their shared memory must fit
sm_90's 227 KB. The MLA tiles of two warpgroups must not compute the scores twice (``mla.isolate_qk``):
the PTX holds one ``wgmma`` per 16 columns of the latent row for QK (per 32 on the fp8 x fp8 tiles), not two.
The Gluon 64-row tile (``mla_sm90``), which the launchers take on an sm_90 GPU, is compiled the same way. No
kernel's wgmma may be serialised by ptxas (its "Potential Performance Loss" C7515, each wgmma fenced alone, read
from ptxas run again on the PTX), as the hostile-input guards once made it on MQA-128's GQA tile.
"""

from __future__ import annotations

from sm90 import WORKLIST, compile_in_child

SCRIPT = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.combine as comb
import splitlab.kernels.gqa as gqa
import splitlab.kernels.mla as mla
import splitlab.kernels.mla_sm90 as sm90
import splitlab.kernels.sparse_mla as smla
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, quantize_fp8, sparse_mla_inputs

gqa._gqa_partial_kernel = Warmup(gqa._gqa_partial_kernel)
mla._mla_decode_kernel = Warmup(mla._mla_decode_kernel)
smla._sparse_mla_decode_kernel = Warmup(smla._sparse_mla_decode_kernel)
comb._combine_kernel = Warmup(comb._combine_kernel)
if sm90.HAVE_GLUON:
    sm90._mla_sm90_kernel = Warmup(sm90._mla_sm90_kernel)


def gluon(launch):  # the launch, with the launchers taking the Gluon kernel where in scope (CPU tensors here)
    def run():
        old, sm90.use_sm90 = sm90.use_sm90, lambda q, *a: sm90.HAVE_GLUON and sm90.in_scope(q.dtype, *a)
        try:
            launch()
        finally:
            sm90.use_sm90 = old
    return run


gqa._check_inputs = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched
launch_common.check_launch_device = lambda *a: None  # (the MLA launchers' device check)

def gqa_case(hq, hkv, d, ps, dt, s, knobs):
    inp = gqa_inputs(2, hq, hkv, d, [100, 7], page_size=ps, dtype=dt)
    gqa.gqa_decode(**inp, num_splits=s, **knobs)


def fp8(x):  # the latent cache as fp8 e4m3 (the kernels dequantise it by kv_scale)
    return dict(x, kv_cache=quantize_fp8(x["kv_cache"], 1.0))


def mla_case(h, dqk, ps, dt, s, knobs, kv8=False):
    x = mla_inputs(2, h, dqk, [100, 7], page_size=ps, dtype=dt)
    mla.mla_decode(**(fp8(x) if kv8 else x), num_splits=s, **knobs)


def sparse_case(h, dqk, dt, s, knobs, kv8=False):
    x = sparse_mla_inputs(2, h, dqk, 256, num_slots=300, invalid_frac=0.3, dtype=dt)
    smla.sparse_mla_decode(**(fp8(x) if kv8 else x), num_splits=s, **knobs)


CASES = [  # name, launch, dtype, QK wgmma per tile expected (None: not checked)
    ("gqa 32/8/128 page 16 S=4", lambda: gqa_case(32, 8, 128, 16, torch.bfloat16, 4, {}), torch.bfloat16, None),
    ("gqa 32/8/128 page 64 S=1", lambda: gqa_case(32, 8, 128, 64, torch.bfloat16, 1, {}), torch.bfloat16, None),
    ("gqa MQA-128 page 1", lambda: gqa_case(128, 1, 128, 1, torch.bfloat16, 2, {}), torch.bfloat16, None),
    ("gqa MQA-128 page 16", lambda: gqa_case(128, 1, 128, 16, torch.bfloat16, 2, {}), torch.bfloat16, None),
    ("gqa 64/8 block_n 128", lambda: gqa_case(64, 8, 128, 16, torch.bfloat16, 2,
                                              dict(block_n=128, num_warps=8, num_stages=3)), torch.bfloat16, None),
    ("gqa 8/2/64 fp16 4 stages", lambda: gqa_case(8, 2, 64, 16, torch.float16, 3, dict(num_stages=4)),
     torch.float16, None),
    ("gqa 16/1/256", lambda: gqa_case(16, 1, 256, 16, torch.bfloat16, 3, {}), torch.bfloat16, None),
    ("gqa fp32 masked head dim", lambda: gqa_case(4, 2, 40, 16, torch.float32, 2, {}), torch.float32, None),
    # MLA-128 default tile (BLOCK_H 64, BLOCK_N 64, 8 warps, 2 stages): QK = 576 / 16 = 36 wgmma
    ("mla 128/576 default", lambda: mla_case(128, 576, 64, torch.bfloat16, 2, {}), torch.bfloat16, 36),
    ("mla 16/576 default", lambda: mla_case(16, 576, 64, torch.bfloat16, 2, {}), torch.bfloat16, None),
    ("mla 16/576 page 1, 32 x 3 stages", lambda: mla_case(16, 576, 1, torch.bfloat16, 2,
                                                          dict(block_n=32, num_stages=3)), torch.bfloat16, None),
    ("sparse 64/512 block_k 64", lambda: sparse_case(64, 512, torch.bfloat16, 2, dict(block_k=64)),
     torch.bfloat16, 32),
    ("sparse 128/576 block_k 64", lambda: sparse_case(128, 576, torch.bfloat16, 1, dict(block_k=64)),
     torch.bfloat16, 36),
    ("sparse 128/576 block_k 32", lambda: sparse_case(128, 576, torch.bfloat16, 3, dict(block_k=32)),
     torch.bfloat16, 36),
    # The Gluon 64-row tile (mla_sm90) where the launchers take it: QK m64n32 per warpgroup, 576 / 16 = 36
    ("gluon mla 128/576", gluon(lambda: mla_case(128, 576, 64, torch.bfloat16, 2, {})), torch.bfloat16, 36),
    ("gluon mla 128/576 fp16 page 1 unsplit", gluon(lambda: mla_case(128, 576, 1, torch.float16, 1, {})),
     torch.float16, 36),
    ("gluon sparse 128/576", gluon(lambda: sparse_case(128, 576, torch.bfloat16, 1, dict(block_k=64))),
     torch.bfloat16, 36),
    ("gluon sparse 64/512", gluon(lambda: sparse_case(64, 512, torch.bfloat16, 2, dict(block_k=64))),
     torch.bfloat16, 32),
    # fp8 e4m3 caches beside a bf16 q, at the default tiles; 64-row tiles: QK as fp8 wgmma k32 (576 / 32 = 18)
    ("mla 128/576 fp8 cache", lambda: mla_case(128, 576, 64, torch.bfloat16, 2, {}, kv8=True), torch.bfloat16, 18),
    ("mla 16/576 fp8 cache", lambda: mla_case(16, 576, 64, torch.bfloat16, 2, {}, kv8=True), torch.bfloat16, None),
    ("sparse 64/512 fp8 pool", lambda: sparse_case(64, 512, torch.bfloat16, 2, {}, kv8=True), torch.bfloat16, 16),
    ("sparse 16/512 fp8 pool", lambda: sparse_case(16, 512, torch.bfloat16, 2, {}, kv8=True), torch.bfloat16, None),
    ("sparse 128/576 fp8 pool", lambda: sparse_case(128, 576, torch.bfloat16, 1, {}, kv8=True), torch.bfloat16, 18),
]
SMEM_LIMIT = 232448  # sm_90's opt-in shared memory per block
# Tolerated stack bytes (spills), measured worth it: DeepSeek-V3.2's sparse tile at BLOCK_K 64 spills 64 B and
# still runs 1.02-1.5x faster than the spill-free BLOCK_K 32 on the H200 (BENCHMARKS.md, sparse BLOCK_K).
# MLA-16's fp8 tile computes in fp16 and spills 8 B; on the H200 it ran 1.23x faster than the spill-free cast to
# bf16 (BENCHMARKS.md, fp8 caches). The sparse 64-row fp8 tiles (fp8 x fp8 QK, 3 stages) spill 8-24 B and ran
# 0.96-0.99x the time of the 2-stage tile (BENCHMARKS.md, fp8 caches).
MAX_STACK = {"sparse 128/576 block_k 64": 64, "mla 16/576 fp8 cache": 8, "sparse 64/512 fp8 pool": 24,
             "sparse 128/576 fp8 pool": 8}
failed = False
for name, launch, dt, qk_wgmma in CASES:
    n0 = len(compiled)
    try:
        launch()
    except Exception as e:
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}")
        failed = True
        continue
    partial = compiled[n0]
    if name.startswith("gluon") and sm90.HAVE_GLUON and partial.metadata.name != "_mla_sm90_kernel":
        print(f"PATH {name}: compiled {partial.metadata.name}, not the Gluon kernel")
        failed = True
    usage = "?"
    if dt != torch.float32 and os.path.exists(cuobjdump):
        # ptxas's own word on serialised wgmma (C7515), from the same PTX compiled again.
        log = ptxas_log(partial)
        if "C7515" in log:
            print(f"WGMMA {name}: ptxas serialises its wgmma: {log.strip()[:300]}")
            failed = True
        usage = resource_line(partial)
        stack = int(re.search(r"STACK:(\d+)", usage).group(1)) if "STACK:" in usage else -1
        if stack > MAX_STACK.get(name, 0) or "LOCAL:0 " not in usage:
            print(f"SPILL {name}: {usage}")
            failed = True
    if partial.metadata.shared > SMEM_LIMIT:
        print(f"SHARED {name}: {partial.metadata.shared} B > {SMEM_LIMIT}")
        failed = True
    if qk_wgmma is not None:
        shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k\d+", partial.asm["ptx"])
        qk = sum(1 for n in shapes if int(n) < 256)  # PV is m64n256 (each warpgroup half of Dv = 512)
        if qk != qk_wgmma:
            print(f"QK {name}: {qk} QK wgmma per tile, expected {qk_wgmma} (shapes {sorted(set(shapes))})")
            failed = True
    print(f"ok {name}: shared {partial.metadata.shared} B; {usage}")
sys.exit(1 if failed else 0)
"""


def test_kernels_compile_for_sm90():
    compile_in_child(SCRIPT)


TIMELINE_SCRIPT = WORKLIST + r"""
mqa = gqa_inputs(2, 128, 1, 128, lens, page_size=16, dtype=torch.bfloat16)
failed = False
for label, s in (("one item", S.uniform(lens, 4)), ("persistent", S.stream_k(lens, 3))):
    work = wl.WorkList.from_schedule(s, "cpu")
    for name, launch in (
        ("gqa 32/8", lambda t: wl.gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work,
                                                       timelines=t)),
        ("mqa-128", lambda t: wl.gqa_decode_scheduled(mqa["q"], mqa["k_cache"], mqa["v_cache"],
                                                      mqa["block_table"], work, timelines=t)),
        ("mla-16", lambda t: wl.mla_decode_scheduled(m["q"], m["kv_cache"], m["block_table"], work, timelines=t)),
    ):
        n0 = len(compiled)
        launch(None)
        launch(timeline.Timelines())
        launch(timeline.Timelines(hold_start=True))
        plain_partial, plain_merge, on_partial, on_merge, held_partial, held_merge = compiled[n0:n0 + 6]
        for kernel, plain, on in (("partial", plain_partial, on_partial), ("merge", plain_merge, on_merge),
                                  ("partial, held start", plain_partial, held_partial),
                                  ("merge, held start", plain_merge, held_merge)):
            p, t = plain.asm["ptx"], on.asm["ptx"]
            if "%globaltimer" in p or "%smid" in p:
                print(f"PLAIN {name} {label} {kernel}: the plain build reads the clock")
                failed = True
            if t.count("%globaltimer") < 2 or "%smid" not in t:
                print(f"CLOCK {name} {label} {kernel}: globaltimer x{t.count('%globaltimer')}, "
                      f"smid x{t.count('%smid')}; expected a start and an end read and the SM")
                failed = True
            print(f"ok {name} {label} {kernel}: plain {usage(plain)}, timed {usage(on)}; shared "
                  f"{plain.metadata.shared} / {on.metadata.shared} B")
sys.exit(1 if failed else 0)
"""


def test_timeline_kernels_read_the_clock():
    """With timelines on (``kernels.timeline``, the GPU's build: ``CLOCK``), every work-list kernel reads
    ``%globaltimer`` at its start and end and ``%smid`` once, the start stored at once or held to the end
    (``hold_start``); the plain build reads neither."""
    r = compile_in_child(TIMELINE_SCRIPT)
    print(r.stdout)
