"""GPU correctness at real sizes (bf16), run on the H200: ``SPLITLAB_GPU_TESTS=1 pytest tests/gpu``.

Every buffer the launchers allocate is poisoned with NaN (``splitlab.kernels._launch.alloc``), so an
element a kernel never writes fails the check; inputs are fresh random draws; NaN never passes.
"""

import os

import pytest
import torch

from splitlab.kernels import reference
from splitlab.kernels.testing import (
    FP8_QUANT_TOLERANCE,
    TOLERANCE,
    fp8_query,
    gqa_inputs,
    lse_err,
    mla_inputs,
    poison_unread_pages_,
    poison_unread_slots_,
    quantize_fp8,
    rel_err,
    sparse_mla_inputs,
)
from splitlab.waves import default_block_h

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a GPU and SPLITLAB_GPU_TESTS=1")

TOL = TOLERANCE[torch.bfloat16]


@pytest.fixture(autouse=True)
def poisoned(allocs):
    """Every buffer the launchers allocate starts as NaN (the ``allocs`` fixture of tests/conftest.py)."""
    return allocs


def _check(out, lse, ref_out, ref_lse):
    assert torch.isfinite(out).all(), "non-finite output"
    assert rel_err(out, ref_out) <= TOL
    assert lse_err(lse, ref_lse) <= 1e-2


@pytest.mark.parametrize("hq,hkv", [(32, 8), (64, 8), (128, 1), (28, 4), (8, 8)])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 16, 64])
def test_gqa_bf16(hq, hkv, page_size, num_splits):
    from splitlab.kernels.gqa import gqa_decode

    lens = [4099, 0, 1, 777, 16384, 63]
    x = gqa_inputs(len(lens), hq, hkv, 128, lens, page_size=page_size, device="cuda", seed=hq + page_size)
    out, lse = gqa_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *reference.gqa_decode(**x, return_lse=True))


@pytest.mark.parametrize("heads", [16, 128, 20])
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("num_splits", [None, 1, 7, 64])
def test_mla_bf16(heads, page_size, num_splits):
    from splitlab.kernels.mla import mla_decode

    lens = [8191, 0, 333, 2048]
    x = mla_inputs(len(lens), heads, 576, lens, page_size=page_size, device="cuda", seed=heads)
    out, lse = mla_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *reference.mla_decode(**x, return_lse=True))


@pytest.mark.parametrize("heads,dqk", [(64, 512), (128, 576), (16, 576)])
@pytest.mark.parametrize("topk", [512, 2048])
@pytest.mark.parametrize("num_splits", [None, 1, 5, 32])
def test_sparse_mla_bf16(heads, dqk, topk, num_splits):
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    x = sparse_mla_inputs(9, heads, dqk, topk, num_slots=50_000, invalid_frac=0.2, empty_rows=1, device="cuda",
                          seed=heads + topk)
    out, lse = sparse_mla_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *reference.sparse_mla_decode(**x, return_lse=True))


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_mla_fp8_cache(heads, num_splits):
    from splitlab.kernels.mla import mla_decode

    x = mla_inputs(4, heads, 576, [8191, 0, 333, 2048], page_size=64, device="cuda", seed=heads + 1)
    x8 = dict(x, kv_cache=quantize_fp8(x["kv_cache"], 0.05))
    out, lse = mla_decode(**x8, num_splits=num_splits, kv_scale=0.05, return_lse=True)
    q = fp8_query(x["q"], default_block_h(heads))  # the fp8-rounded q of the fp8 x fp8 QK tiles
    _check(out, lse, *reference.mla_decode(**dict(x8, q=q), kv_scale=0.05, return_lse=True))
    assert rel_err(out, reference.mla_decode(**x)) <= FP8_QUANT_TOLERANCE


@pytest.mark.parametrize("heads,dqk", [(64, 512), (128, 576), (16, 512)])
def test_sparse_mla_fp8_pool(heads, dqk):
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    x = sparse_mla_inputs(9, heads, dqk, 2048, num_slots=50_000, invalid_frac=0.2, empty_rows=1, device="cuda",
                          seed=heads + 2)
    x8 = dict(x, kv_cache=quantize_fp8(x["kv_cache"], 3.0))
    out, lse = sparse_mla_decode(**x8, num_splits=4, kv_scale=3.0, return_lse=True)
    q = fp8_query(x["q"], default_block_h(heads))
    _check(out, lse, *reference.sparse_mla_decode(**dict(x8, q=q), kv_scale=3.0, return_lse=True))
    assert rel_err(out, reference.sparse_mla_decode(**x)) <= FP8_QUANT_TOLERANCE


@pytest.mark.parametrize("knobs", [dict(block_n=32, num_warps=4, num_stages=2), dict(block_n=128, num_warps=8,
                                                                                        num_stages=3)])
def test_gqa_tiles_bf16(knobs):
    from splitlab.kernels.gqa import gqa_decode

    x = gqa_inputs(3, 32, 8, 128, [5000, 12, 0], page_size=16, device="cuda", seed=5)
    out, lse = gqa_decode(**x, num_splits=8, return_lse=True, **knobs)
    _check(out, lse, *reference.gqa_decode(**x, return_lse=True))


@pytest.mark.parametrize("knobs", [dict(block_n=32, block_h=16, num_warps=4, num_stages=1),
                                   dict(block_n=64, block_h=64, num_warps=8, num_stages=2),
                                   dict(block_n=32, block_h=32, num_warps=4, num_stages=2)])
def test_mla_tiles_bf16(knobs):
    from splitlab.kernels.mla import mla_decode

    x = mla_inputs(3, 128, 576, [3000, 0, 65], page_size=64, device="cuda", seed=6)
    out, lse = mla_decode(**x, num_splits=4, return_lse=True, **knobs)
    _check(out, lse, *reference.mla_decode(**x, return_lse=True))


@pytest.mark.parametrize("knobs", [dict(block_k=32, block_h=16, num_warps=4), dict(block_k=64, block_h=64,
                                                                                    num_warps=8)])
def test_sparse_tiles_bf16(knobs):
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    x = sparse_mla_inputs(4, 64, 512, 2048, num_slots=10_000, invalid_frac=0.3, device="cuda", seed=7)
    out, lse = sparse_mla_decode(**x, num_splits=4, return_lse=True, **knobs)
    _check(out, lse, *reference.sparse_mla_decode(**x, return_lse=True))


@pytest.fixture
def sm90_launches(monkeypatch):
    """Counts the launches of the Gluon 64-row tile (``mla_sm90``)."""
    from splitlab.kernels import mla_sm90

    count = [0]
    real = mla_sm90._launch

    def counted(*a, **k):
        count[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(mla_sm90, "_launch", counted)
    return count


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("heads,page_size,lens", [(128, 64, [8191, 0, 333, 2048]), (96, 16, [5000, 17, 64]),
                                                  (128, 1, [700, 1, 129])])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_mla_64_row_tile_both_paths(gluon, heads, page_size, lens, num_splits, monkeypatch, sm90_launches):
    """The 64-row tile on both kernels: the Gluon one (the default on sm_90) and the tl one (``ENABLED`` off),
    with the rows past each request's end and the unused pages of the cache poisoned with NaN."""
    from splitlab.kernels import mla_sm90
    from splitlab.kernels.mla import mla_decode

    monkeypatch.setattr(mla_sm90, "ENABLED", gluon)
    x = mla_inputs(len(lens), heads, 576, lens, page_size=page_size, device="cuda", seed=heads + page_size)
    ref = reference.mla_decode(**x, return_lse=True)
    poison_unread_pages_(x["kv_cache"], x["block_table"], lens, page_size)
    out, lse = mla_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *ref)
    sm90 = torch.cuda.get_device_capability()[0] == 9 and mla_sm90.HAVE_GLUON
    assert sm90_launches[0] == int(gluon and sm90)


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("heads,dqk", [(128, 576), (64, 512)])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_sparse_64_row_tile_both_paths(gluon, heads, dqk, num_splits, monkeypatch, sm90_launches):
    """Sparse MLA's 64-row tile (asked for: the planner may pick 16 rows) on both kernels, with -1 indices,
    a token without any, and the pool's unread rows poisoned with NaN."""
    from splitlab.kernels import mla_sm90
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    monkeypatch.setattr(mla_sm90, "ENABLED", gluon)
    x = sparse_mla_inputs(7, heads, dqk, 2048, num_slots=20_000, invalid_frac=0.3, empty_rows=1, device="cuda",
                          seed=heads + dqk)
    ref = reference.sparse_mla_decode(**x, return_lse=True)
    poison_unread_slots_(x["kv_cache"], x["indices"])
    out, lse = sparse_mla_decode(**x, num_splits=num_splits, block_h=64, block_k=64, return_lse=True)
    _check(out, lse, *ref)
    sm90 = torch.cuda.get_device_capability()[0] == 9 and mla_sm90.HAVE_GLUON
    assert sm90_launches[0] == int(gluon and sm90)
