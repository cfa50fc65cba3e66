"""GPU correctness at real sizes (bf16), run on the H200: ``SPLITLAB_GPU_TESTS=1 pytest tests/gpu``.

Every buffer the launchers allocate is poisoned with NaN (``splitlab.kernels._launch.alloc``), so an
element a kernel never writes fails the check; inputs are fresh random draws; NaN never passes.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels._launch import VALIDATE_ENV
from splitlab.kernels.accuracy import FP8_QUANT_TOLERANCE, TOLERANCE, assert_same_nonfinite, fp8_query, lse_err, rel_err
from splitlab.kernels.inputs import (
    gqa_inputs,
    mla_inputs,
    poison_unread_pages_,
    poison_unread_slots_,
    quantize_fp8,
    set_key_,
    sparse_mla_inputs,
    strided_lens,
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


# --- hostile inputs: strided seq_lens, NaN / inf in a key, validation, unvalidated bad values --------------------


def _gluon_runs() -> bool:
    from splitlab.kernels import mla_sm90

    return torch.cuda.get_device_capability()[0] == 9 and mla_sm90.HAVE_GLUON


@pytest.mark.parametrize("how", ["column", "every-other"])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_gqa_strided_seq_lens(how, num_splits):
    """``seq_lens`` a column of a [B, 2] tensor or ``t[::2]`` (the neighbours hold 2^30): read through its stride."""
    from splitlab.kernels.gqa import gqa_decode

    lens = [4099, 0, 1, 777, 16384]
    x = gqa_inputs(len(lens), 32, 8, 128, lens, page_size=16, device="cuda", seed=31)
    ref = reference.gqa_decode(**x, return_lse=True)
    x["seq_lens"] = strided_lens(lens, how, device="cuda")
    out, lse = gqa_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *ref)


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("heads", [128, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_mla_strided_seq_lens(gluon, heads, num_splits, monkeypatch, sm90_launches):
    from splitlab.kernels import mla_sm90
    from splitlab.kernels.mla import mla_decode

    monkeypatch.setattr(mla_sm90, "ENABLED", gluon)
    lens = [8191, 0, 333, 2048]
    x = mla_inputs(len(lens), heads, 576, lens, page_size=64, device="cuda", seed=heads + 32)
    ref = reference.mla_decode(**x, return_lse=True)
    x["seq_lens"] = strided_lens(lens, "column", device="cuda")
    out, lse = mla_decode(**x, num_splits=num_splits, return_lse=True)
    _check(out, lse, *ref)
    assert sm90_launches[0] == int(gluon and heads == 128 and _gluon_runs())


@pytest.mark.parametrize("num_splits", [1, 4, 16])
def test_gqa_nan_and_inf_in_a_key(num_splits):
    """NaN in a key's K (every head of its kv head: NaN rows), NaN in a V column, +inf in a K column (+-inf scores
    by the sign of q): NaN / inf exactly where the fp64 reference has them, split or not."""
    from splitlab.kernels.gqa import gqa_decode

    x = gqa_inputs(3, 32, 8, 128, [3000, 500, 0], page_size=16, device="cuda", seed=33)
    set_key_(x["k_cache"], x["block_table"], 0, 1234, float("nan"), 3, 17)
    set_key_(x["v_cache"], x["block_table"], 0, 2500, float("nan"), 5, 9)
    set_key_(x["k_cache"], x["block_table"], 1, 100, float("inf"), 1, 4)
    x["q"][1, 4:8, 4] = torch.tensor([0.5, -0.5, 1.0, -1.0])  # kv head 1's heads: both signs
    ref = reference.gqa_decode(**x)
    assert torch.isnan(ref[0]).any() and torch.isnan(ref[1]).any() and torch.isfinite(ref[1]).any()
    assert_same_nonfinite(gqa_decode(**x, num_splits=num_splits), ref, torch.bfloat16)


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("num_splits", [1, 7])
def test_mla_nan_and_inf_in_a_key(gluon, num_splits, monkeypatch, sm90_launches):
    """NaN in a V column of one latent row (every head's row NaN), +inf in a rope column of another (NaN rows where
    q's column is positive), on the Gluon tile and the tl one."""
    from splitlab.kernels import mla_sm90
    from splitlab.kernels.mla import mla_decode

    monkeypatch.setattr(mla_sm90, "ENABLED", gluon)
    x = mla_inputs(3, 128, 576, [8191, 333, 2048], page_size=64, device="cuda", seed=34)
    set_key_(x["kv_cache"], x["block_table"], 0, 4000, float("nan"), 100)
    set_key_(x["kv_cache"], x["block_table"], 2, 17, float("inf"), 540)
    x["q"][2, :2, 540] = torch.tensor([0.5, -0.5])  # one head of each sign
    ref = reference.mla_decode(**x)
    assert torch.isnan(ref[0]).all() and torch.isfinite(ref[1]).all() and torch.isfinite(ref[2]).any()
    assert_same_nonfinite(mla_decode(**x, num_splits=num_splits), ref, torch.bfloat16)
    assert sm90_launches[0] == int(gluon and _gluon_runs())


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("heads,dqk", [(128, 576), (64, 512)])
@pytest.mark.parametrize("num_splits", [1, 5])
def test_sparse_nan_and_inf_in_a_row(gluon, heads, dqk, num_splits, monkeypatch, sm90_launches):
    """NaN in a pool row only token 0 attends; at 576 also +inf in a rope column of a row only token 2 attends."""
    from splitlab.kernels import mla_sm90
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    monkeypatch.setattr(mla_sm90, "ENABLED", gluon)
    x = sparse_mla_inputs(4, heads, dqk, 2048, num_slots=20_000, invalid_frac=0.2, device="cuda", seed=heads + 35)
    idx = x["indices"]
    for t, k, col, value in [(0, 777, 100, float("nan"))] + ([(2, 5, 550, float("inf"))] if dqk > 512 else []):
        slot = int(idx[t][idx[t] >= 0][k])
        others = [u for u in range(4) if u != t]
        idx[others] = torch.where(idx[others] == slot, -1, idx[others])  # only token t attends the slot
        x["kv_cache"][slot, col] = value
    if dqk > 512:
        x["q"][2, :2, 550] = torch.tensor([0.5, -0.5])  # one head of each sign: a NaN row and a dropped key
    ref = reference.sparse_mla_decode(**x)
    assert torch.isnan(ref[0]).all() and torch.isfinite(ref[1]).all()
    out = sparse_mla_decode(**x, num_splits=num_splits, block_h=64, block_k=64)
    assert_same_nonfinite(out, ref, torch.bfloat16)
    assert sm90_launches[0] == int(gluon and _gluon_runs())


def test_validation_refuses_bad_values(monkeypatch):
    """Block-table entries and lengths out of range: refused on the planned path, with ``validate=True`` and with
    ``SPLITLAB_VALIDATE=1``; sparse indices by default."""
    from splitlab.kernels.gqa import gqa_decode
    from splitlab.kernels.mla import mla_decode
    from splitlab.kernels.sparse_mla import sparse_mla_decode

    x = gqa_inputs(3, 32, 8, 128, [300, 50, 7], page_size=16, device="cuda", seed=36)
    x["block_table"][1, 2] = 10**6
    y = mla_inputs(3, 128, 576, [300, 50, 7], page_size=64, device="cuda", seed=36)
    y["seq_lens"][0] = 10**6
    for knobs in ({}, dict(num_splits=4, validate=True)):
        with pytest.raises(SplitlabError, match=r"^block_table\[1, 2\] = 1000000 is outside"):
            gqa_decode(**x, **knobs)
        with pytest.raises(SplitlabError, match=r"^seq_lens has values in \[7, 1000000\]"):
            mla_decode(**y, **knobs)
    monkeypatch.setenv(VALIDATE_ENV, "1")
    with pytest.raises(SplitlabError, match=r"^block_table\[1, 2\]"):
        gqa_decode(**x, num_splits=4)
    monkeypatch.delenv(VALIDATE_ENV)
    z = sparse_mla_inputs(2, 64, 512, 512, num_slots=5000, device="cuda", seed=36)
    z["indices"][1, 3] = 5000
    with pytest.raises(SplitlabError, match=r"^indices has values in \[-1, 5000\]"):
        sparse_mla_decode(**z, num_splits=2)


def test_unvalidated_hostile_inputs_stay_in_bounds():
    """``hostile.py`` in its own process (a fault would spoil this session's CUDA context): pages, lengths and
    indices out of range without validation read nothing outside their buffers, give NaN where the module
    docstrings say so, and leave the other requests right; validation under graph capture is refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", VALIDATE_ENV)}
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("hostile.py"))], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "hostile: all cases ok" in r.stdout
