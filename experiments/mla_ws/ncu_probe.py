"""MLA decodes under Nsight Compute (``ncu.sh``), every case in one process: each case is built and warmed up, then
launched once between ``cudaProfilerStart`` / ``Stop`` (``ncu --profile-from-start off`` profiles only those), its
launches announced on stdout in order (``ncu.sh`` pairs them with ncu's rows by that order).

    python experiments/mla_ws/ncu_probe.py [--fmla KIT] CASE [CASE ...]

CASE is ``IMPL:HEADS:BATCH:LONGEST:DIST`` (576/512 bf16, page 64, one kv head; lengths as ``ab.py``'s,
``abharness.ab_workload``). IMPL: ``splitlab`` (``worklist.mla_decode_scheduled`` at splitlab's scheduler, one item a
slot: the seesaw kernel from 40 heads on, the tl tile below), ``splitlab@flashmla`` (the same launcher at FlashMLA's
schedule, ``schedulers.flashmla_schedule``: the two kernels at one work split; a persistent schedule runs the tl
tile's item loop) or ``flashmla`` (FlashMLA from the workplace kit, its own scheduler). Each case's output is checked
against the fp64 reference before it is profiled (a wrong one is announced and skipped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import load_flashmla  # noqa: E402  (FlashMLA from the kit: '' when loaded, else why not)

from splitlab.kernels.accuracy import TOLERANCE  # noqa: E402


def build(impl: str, heads: int, batch: int, longest: int, dist: str):
    from splitlab.bench import abharness as harness
    from splitlab.bench.decode import rotated_inputs
    from splitlab.devices import detect
    from splitlab.kernels import reference
    from splitlab.kernels.accuracy import rel_err
    from splitlab.kernels.worklist import WorkList, mla_decode_scheduled
    from splitlab.planners import schedulers

    w = harness.ab_workload("mla", batch, heads, 576, 512, longest, 64, dist)
    x = rotated_inputs(w, draw_on="device", sets=1)[0]
    dev = detect()
    if impl == "flashmla":
        from splitlab.bench.peers_flashmla import FLASHMLA_DECODE

        fn = FLASHMLA_DECODE.call(w, x, {})
    else:
        s = (schedulers.splitlab(w, dev, persistent=False) if impl == "splitlab"
             else schedulers.flashmla_schedule(w, dev))
        wl = WorkList.from_schedule(s, "cuda")
        fn = lambda: mla_decode_scheduled(x["q"], x["kv_cache"], x["block_table"], wl)  # noqa: E731
    out = fn()
    out = out[0] if isinstance(out, tuple) else out
    return fn, rel_err(out, reference.mla_decode(**x, head_dim_v=512))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmla", default="")
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    if any(c.startswith("flashmla:") for c in args.cases):
        why = load_flashmla(args.fmla)
        if why:
            print("flashmla unavailable:", why, flush=True)
    for case in args.cases:
        impl, heads, batch, longest, dist = case.split(":")
        try:
            fn, err = build(impl, int(heads), int(batch), int(longest), dist)
        except Exception as e:  # a case that cannot run is a line, the others go on
            print(f"CASE {case} error {type(e).__name__}: {e}", flush=True)
            continue
        if not err <= TOLERANCE[torch.bfloat16]:
            print(f"CASE {case} wrong rel_err={err:.2e}", flush=True)
            continue
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        print(f"CASE {case} rel_err={err:.2e}", flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
