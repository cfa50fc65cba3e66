"""Where the default call's host time goes, through a plan (``kernels.default_call``), on a GPU: a diagnostic.

    python experiments/plan_run/default_profile.py --out OUT

For GQA 32/8/128 (8 requests of 4K keys, page 16) and MLA-128 576/512 (16 requests of 8K keys, page 64), bf16, the
default call through a cached plan (``default_call.with_plan``): its host time a call without a sync (back-to-back
calls, the GPU never holding the host back at these sizes: ``launch_probe.host_us``), and that of its two pieces,
``plan_on_device`` and ``run(return_lse=True, check=False)``; the wall time a call (``gpu.eager_us``) with the plans'
``PDL`` off and on; then ``torch.profiler`` (CPU and CUDA, 20 calls: which launches, how long each takes on the host)
and ``cProfile`` (200 calls: the Python functions by own time). Writes OUT/default_profile.txt (everything printed)
and OUT/default_profile.csv (one row per timing).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from splitlab.bench.csvrows import write_rows
from splitlab.kernels import default_call, gqa, mla
from splitlab.kernels.inputs import gqa_inputs, mla_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import eager_us  # noqa: E402  (wall time a call, synchronised at the end)
from launch_probe import host_us  # noqa: E402  (host time a call before the sync, best of 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    log = io.StringIO()

    def say(*a) -> None:
        print(*a, flush=True)
        print(*a, file=log)

    x = gqa_inputs(8, 32, 8, 128, 4096, page_size=16, device="cuda", draw_on="device")
    y = mla_inputs(16, 128, 576, 8192, page_size=64, device="cuda", draw_on="device")
    cases = {"gqa 32/8 8x4K": (default_call.with_plan(lambda: gqa.gqa_decode(**x)), x["seq_lens"],
                               (x["q"], x["k_cache"], x["v_cache"], x["block_table"])),
             "mla-128 16x8K": (default_call.with_plan(lambda: mla.mla_decode(**y, head_dim_v=512)), y["seq_lens"],
                               (y["q"], y["kv_cache"], y["block_table"]))}
    rows = []
    for name, (fn, lens, args) in cases.items():
        for pdl in (False, True):
            default_call.PDL = pdl
            fn()
            plan = next(reversed(default_call._plans.values()))
            for piece, f in (("default call, host", fn), ("default call, wall", fn),
                             ("plan_on_device, host", lambda p=plan, n=lens: p.plan_on_device(n)),
                             ("run(return_lse, check=False), host",
                              lambda p=plan, a=args: p.run(*a, return_lse=True, check=False))):
                f()
                us = round(eager_us(f, 300) if piece.endswith("wall") else host_us(f, 300), 1)
                rows.append(dict(case=name, pdl=pdl, piece=piece, us=us, gpu=torch.cuda.get_device_name(),
                                 torch=torch.__version__))
                say(rows[-1])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        say(name, "torch.profiler, 20 calls:")
        say(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        say(name, "cProfile, 200 calls:")
        say(s.getvalue())
    write_rows(out / "default_profile.csv", rows)
    (out / "default_profile.txt").write_text(log.getvalue())


if __name__ == "__main__":
    main()
