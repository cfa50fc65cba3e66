"""Which launches the Gluon 64-row tile (``kernels.mla_sm90``) takes: its scope, and never on the CPU.

The kernel itself is compiled for sm_90a in ``test_compile_sm90.py`` and run on the H200 in ``tests/gpu``."""

import pytest
import torch

from splitlab.kernels import mla_sm90
from splitlab.kernels.mla import mla_defaults
from splitlab.kernels.sparse_mla import sparse_mla_defaults

BF16, FP16, FP32, FP8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn


def _scope(dtype, kv_dtype, dqk, dv, tile):
    return mla_sm90.in_scope(dtype, kv_dtype, dqk, dv, tile.block_h, tile.block_n, tile.num_warps, tile.num_stages)


@pytest.mark.parametrize("heads", [64, 96, 128, 192])
def test_default_64_row_tiles_are_in_scope(heads):
    assert _scope(BF16, BF16, 576, 512, mla_defaults(heads, 576, "bf16"))
    assert _scope(FP16, FP16, 576, 512, mla_defaults(heads, 576, "fp16"))
    assert _scope(BF16, BF16, 512, 512, sparse_mla_defaults(heads, 512, "bf16"))  # seed 003's sparse shape
    assert _scope(BF16, BF16, 576, 512, sparse_mla_defaults(heads, 576, "bf16"))  # DeepSeek-V3.2's


@pytest.mark.parametrize("heads", [16, 20, 32])
def test_narrow_tiles_are_not(heads):
    assert not _scope(BF16, BF16, 576, 512, mla_defaults(heads, 576, "bf16"))


def test_other_dtypes_dims_and_knobs_are_not():
    tile = mla_defaults(128, 576, "bf16")
    assert not _scope(BF16, FP8, 576, 512, tile)  # an fp8 cache runs the tl kernel's fp8 x fp8 QK
    assert not _scope(FP32, FP32, 576, 512, tile)
    assert not _scope(BF16, FP16, 576, 512, tile)
    assert not _scope(BF16, BF16, 576, 448, tile)  # Dv not 256 / 512
    assert not _scope(BF16, BF16, 640, 512, tile)  # Dqk - Dv not 0 / 64
    assert not _scope(BF16, BF16, 576, 512, mla_defaults(128, 576, "bf16", block_n=32))
    assert not mla_sm90.in_scope(BF16, BF16, 576, 512, 64, 64, 8, 3)  # an explicit num_stages


def test_never_on_the_cpu():
    q = torch.zeros(2, 128, 576, dtype=BF16)
    assert not mla_sm90.use_sm90(q, BF16, 576, 512, 64, 64, 8, 2)


def test_partial_dtype():
    # 16-bit partials come only from the Gluon tile (its epilogue stages them into whole rows); the tl kernels,
    # and every fp32 launch, keep fp32 partials.
    assert mla_sm90.partial_dtype(torch.bfloat16, True) == (torch.bfloat16 if mla_sm90.PARTIALS_16BIT
                                                            else torch.float32)
    assert mla_sm90.partial_dtype(torch.bfloat16, False) == torch.float32
    assert mla_sm90.partial_dtype(torch.float16, False) == torch.float32


@pytest.mark.parametrize("kind", ["mla", "sparse_mla"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8_e4m3"])
@pytest.mark.parametrize("dqk,dv", [(576, 512), (512, 512), (320, 256), (576, 448), (640, 512)])
@pytest.mark.parametrize("heads", [16, 32, 64, 128])
def test_the_planner_knows_where_the_gluon_tile_runs(kind, dtype, dqk, dv, heads):
    """``planners.splitlab.sm90_tile_runs`` (plain numbers: the planner imports no torch) agrees with ``in_scope`` at
    the kernels' default tile, and ``partial_bytes`` with ``partial_dtype``: 2 bytes where the tile runs."""
    from splitlab.planners import splitlab as rule
    from splitlab.workloads import DecodeWorkload

    w = DecodeWorkload(kind, 4, heads, 1, dqk, dv, 65536, page_size=64 if kind == "mla" else 1, dtype=dtype,
                       topk=2048 if kind == "sparse_mla" else 0)
    tile = (mla_defaults if kind == "mla" else sparse_mla_defaults)(heads, dqk, dtype)
    torch_dtype = {"bf16": BF16, "fp16": FP16, "fp8_e4m3": FP8}[dtype]
    q_dtype = BF16 if dtype == "fp8_e4m3" else torch_dtype  # an fp8 cache takes bf16 queries
    runs = _scope(q_dtype, torch_dtype, dqk, dv, tile)
    rows = rule.tile_rows(w)
    assert rule.sm90_tile_runs(w, rows, "sm_90") == runs
    assert not rule.sm90_tile_runs(w, rows, "gfx950") and not rule.sm90_tile_runs(w, rows, "sm_100")
    assert rule.partial_bytes(w, rows, "sm_90") == mla_sm90.partial_dtype(q_dtype, runs).itemsize
    if kind == "sparse_mla" and dqk <= 512:  # the rule's other key tile, BLOCK_K 32, runs the tl kernel
        assert not _scope(q_dtype, torch_dtype, dqk, dv, sparse_mla_defaults(heads, dqk, dtype, block_k=32))
        assert not rule.sm90_tile_runs(w, rows, "sm_90", 32)
