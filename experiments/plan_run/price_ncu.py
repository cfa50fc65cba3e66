"""splitlab's pricing on the device, launched for Nsight Compute to profile (a diagnostic; the README's command runs
it under ``ncu``): the schedule kernels of ``kernels.device_schedule`` (scheduler ``splitlab``, the H200 preset's
constants, a plan's default capacity) twice each for GQA 32/8 and MLA-16 at 64 requests of 1-30,000 keys and GQA
32/8 at 16 requests of 1-6,000, as ``tests/gpu/test_device_schedule_gpu.py::test_price_warps`` draws them.

    python experiments/plan_run/price_ncu.py
"""

from __future__ import annotations

import random

import torch

from splitlab import devices
from splitlab.kernels.device_schedule import schedule_on_device, splitlab_pricing
from splitlab.planners import schedulers as S
from splitlab.planners import splitlab as rule
from splitlab.workloads import DecodeWorkload

SHAPES = {"gqa-32/8": ("gqa", 32, 8, 128, 128, 16), "mla-16": ("mla", 16, 1, 576, 512, 64)}
CASES = (("gqa-32/8", 64, 30_000), ("mla-16", 64, 30_000), ("gqa-32/8", 16, 6000))


def schedule(shape: str, lens: list[int], max_batch: int = 64) -> None:
    """The splitlab schedule of ``lens`` on the device at a plan's default capacity (8 x the batch or 8 waves)."""
    kind, hq, hkv, dqk, dv, page = SHAPES[shape]
    B = len(lens)
    w = DecodeWorkload(kind, B, hq, hkv, dqk, dv, 1, page_size=page, seq_lens=(1,) * B)
    dev = devices.get("h200")
    cap = max(8 * B, 8 * S.slots_per_group(w, dev))
    pricing = splitlab_pricing(w, dev, rule.constants_for(dev, kind).constants, cap, "cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    schedule_on_device(torch.tensor(lens, **i32), torch.zeros(cap, 4, **i32), torch.zeros(cap + 1, **i32),
                       torch.zeros(B + 1, **i32), torch.zeros(1, **i32), torch.zeros(1, **i32),
                       scheduler="splitlab", pricing=pricing, max_batch=max_batch)


def main() -> None:
    rng = random.Random(9)
    for shape, B, hi in CASES:
        lens = [rng.randint(1, hi) for _ in range(B)]
        for _ in range(2):
            schedule(shape, lens)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
