"""One decode under Nsight Compute (``ncu.sh``): warm it up, then profile one call between cudaProfilerStart/Stop.
``python experiments/frontier_ab/ncu_probe.py IMPL:HQ:HKV:BATCH:KEYS:SPLITS``; IMPL ``tl`` (page 16), ``tl64`` (page
64) or an SDPA backend."""

import sys

import torch

from splitlab.bench.peers import contiguous_kv, sdpa
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs


def decode(case: str):
    impl, *dims = case.split(":")
    hq, hkv, batch, n, splits = map(int, dims)
    if impl in ("tl", "tl64"):
        x = gqa_inputs(batch, hq, hkv, 128, n, page_size=64 if impl == "tl64" else 16, device="cuda", seed=0,
                       draw_on="device")
        return lambda: gqa_decode(**x, num_splits=splits)
    return sdpa(impl, *contiguous_kv(batch, hq, hkv, 128, n, seed=0))


if __name__ == "__main__":
    fn = decode(sys.argv[1])
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
