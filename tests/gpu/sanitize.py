"""A few small launches of every kernel, for ``compute-sanitizer --tool memcheck python3 tests/gpu/sanitize.py``
on the GPU machine (the interpreter is no memory checker)."""

import torch

from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.mla import mla_decode
from splitlab.kernels.sparse_mla import sparse_mla_decode
from splitlab.kernels.testing import gqa_inputs, mla_inputs, quantize_fp8, sparse_mla_inputs

for s in (1, 3):
    gqa_decode(**gqa_inputs(3, 12, 4, 128, [700, 0, 33], page_size=16, device="cuda"), num_splits=s)
    mla_decode(**mla_inputs(2, 20, 576, [300, 0], page_size=1, device="cuda"), num_splits=s)
    mla_decode(**mla_inputs(2, 128, 576, [300, 0], page_size=64, device="cuda"), num_splits=s)  # Gluon on sm_90
    mla_decode(**mla_inputs(2, 128, 576, [300, 0], page_size=64, device="cuda"), num_splits=s, num_stages=1)  # tl
    x = mla_inputs(2, 16, 576, [300, 0], page_size=16, device="cuda")
    mla_decode(**dict(x, kv_cache=quantize_fp8(x["kv_cache"], 0.5)), kv_scale=0.5, num_splits=s)  # fp8 cache
    x = mla_inputs(2, 128, 576, [300, 0], page_size=64, device="cuda")  # fp8 x fp8 QK (64-row tiles)
    mla_decode(**dict(x, kv_cache=quantize_fp8(x["kv_cache"], 0.5)), kv_scale=0.5, num_splits=s)
    sparse_mla_decode(**sparse_mla_inputs(3, 64, 512, 256, num_slots=1000, invalid_frac=0.3, empty_rows=1,
                                          device="cuda"), num_splits=s)
    sparse_mla_decode(**sparse_mla_inputs(3, 128, 576, 256, num_slots=1000, invalid_frac=0.3, empty_rows=1,
                                          device="cuda"), num_splits=s)  # Gluon on sm_90
torch.cuda.synchronize()
print("sanitize: all launches done")
