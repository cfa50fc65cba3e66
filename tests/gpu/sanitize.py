"""A few small launches of every kernel, for ``compute-sanitizer --tool memcheck python3 tests/gpu/sanitize.py``
on the GPU machine (the interpreter is no memory checker); then unvalidated out-of-range pages, lengths and indices,
which every kernel must keep inside its buffers (``splitlab.kernels._launch``, "Validation of values")."""

import torch

from splitlab.kernels import mla_sm90
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, quantize_fp8, sparse_mla_inputs
from splitlab.kernels.mla import mla_decode
from splitlab.kernels.sparse_mla import sparse_mla_decode

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
for s in (1, 3):  # unvalidated hostile values (validation off: explicit num_splits, validate=False)
    x = gqa_inputs(3, 12, 4, 128, [700, 0, 33], page_size=16, device="cuda")
    x["block_table"][0, 5] = 10**6
    x["seq_lens"][2] = 10**9
    gqa_decode(**x, num_splits=s)
    for gluon in (True, False):  # the Gluon tile on sm_90, and the tl kernel
        mla_sm90.ENABLED = gluon
        y = mla_inputs(3, 128, 576, [300, 0, 100], page_size=64, device="cuda")
        y["block_table"][0, 2] = -5
        y["block_table"][2, 0] = 10**6
        y["seq_lens"][1] = 10**9
        mla_decode(**y, num_splits=s)
        z = sparse_mla_inputs(3, 128, 576, 256, num_slots=1000, device="cuda")
        z["indices"][0, 3] = 10**6
        z["indices"][1, 4] = -9
        sparse_mla_decode(**z, num_splits=s, block_h=64, block_k=64, validate=False)
    mla_sm90.ENABLED = True
torch.cuda.synchronize()
print("sanitize: all launches done")
