"""The shared split-K combine against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import combine as combine_mod
from splitlab.kernels import reference
from splitlab.kernels.combine import combine, combine_grid, combine_tile
from splitlab.kernels.testing import TOLERANCE, lse_err, poison_, rel_err


def _partials(rows, heads, splits, dv, *, seed=0, empty_frac=0.3):
    """Random partials; about ``empty_frac`` of the splits are empty (lse -inf) and hold NaN garbage;
    row 0, head 0 has every split empty."""
    g = torch.Generator().manual_seed(seed)
    po = torch.randn(rows, heads, splits, dv, generator=g)
    pl = torch.randn(rows, heads, splits, generator=g) * 4.0
    empty = torch.rand(rows, heads, splits, generator=g) < empty_frac
    empty[0, 0] = True
    pl[empty] = float("-inf")
    po[empty] = float("nan")
    return po, pl


@pytest.mark.parametrize("rows,heads,splits,dv", [(2, 3, 5, 40), (1, 2, 40, 192), (3, 1, 1, 16), (1, 2, 150, 24)])
def test_matches_reference(rows, heads, splits, dv):
    po, pl = _partials(rows, heads, splits, dv, seed=splits)
    out, lse = combine(po, pl)
    ref, ref_lse = reference.combine(po, pl)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-6
    assert lse_err(lse, ref_lse) <= 1e-5
    assert torch.all(out[0, 0] == 0) and torch.isneginf(lse[0, 0])  # the all-empty row


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_out_dtype_and_given_buffers(dtype):
    po, pl = _partials(2, 4, 6, 32, seed=1)
    out = poison_(torch.empty(2, 4, 32, dtype=dtype))
    lse = poison_(torch.empty(2, 4))
    got, got_lse = combine(po, pl, out=out, lse=lse)
    assert got is out and got_lse is lse
    ref, ref_lse = reference.combine(po, pl)
    assert rel_err(out, ref) <= TOLERANCE[dtype]
    assert lse_err(lse, ref_lse) <= 1e-5
    assert combine(po, pl, out_dtype=dtype)[0].dtype == dtype


def test_non_contiguous_partials():
    po, pl = _partials(3, 2, 4, 24, seed=2)
    po_t = po.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)  # split-major storage, same values
    pl_t = pl.transpose(0, 1).contiguous().transpose(0, 1)
    assert not po_t.is_contiguous() and not pl_t.is_contiguous()
    out, lse = combine(po_t, pl_t)
    ref, ref_lse = reference.combine(po, pl)
    assert rel_err(out, ref) <= 1e-6 and lse_err(lse, ref_lse) <= 1e-5


def test_every_split_empty():
    po = torch.full((2, 2, 3, 16), float("nan"))
    pl = torch.full((2, 2, 3), float("-inf"))
    out, lse = combine(po, pl)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_grid():
    assert combine_grid(4, 8, 2, 128) == (32, 1)
    assert combine_grid(4, 8, 2, 512) == (32, 4)
    assert combine_grid(64, 128, 2, 512) == (8192, 1)  # enough (row, head) pairs: whole 512-column rows


def test_tile_rule():
    # (BLOCK_S, BLOCK_D, num_warps): BLOCK_D widens while MIN_PROGRAMS programs remain; ~128 partials a thread
    assert combine_tile(16, 128, 4, 512) == (4, 256, 1)
    assert combine_tile(64, 128, 2, 512) == (2, 512, 1)
    assert combine_tile(1, 128, 64, 512) == (64, 128, 2)
    assert combine_tile(1, 32, 300, 128) == (64, 128, 2)
    assert combine_tile(4096, 8, 3, 64) == (4, 64, 1)  # never wider than the head dim
    assert combine_tile(4096, 8, 3, 96) == (4, 128, 1)


@pytest.mark.parametrize("rows,heads,splits,dv", [(3, 5, 7, 40), (2, 3, 40, 200), (5, 2, 2, 300)])
def test_every_tile_shape_merges(monkeypatch, rows, heads, splits, dv):
    # MIN_PROGRAMS 1 makes tiny shapes take the wide tiles (BLOCK_D up to 512, several warps) that real sizes get
    monkeypatch.setattr(combine_mod, "MIN_PROGRAMS", 1)
    assert combine_tile(rows, heads, splits, dv)[1:] in {(64, 1), (256, 4), (512, 1)}  # the tiles meant here
    po, pl = _partials(rows, heads, splits, dv, seed=dv)
    out, lse = combine(po, pl)
    ref, ref_lse = reference.combine(po, pl)
    assert rel_err(out, ref) <= 1e-6 and lse_err(lse, ref_lse) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_partials(dtype):
    # The Gluon MLA tile's split launches store 16-bit partials (mla_sm90.PARTIALS_16BIT); the merge reads them as
    # fp32, so against the reference on the same rounded values it is as exact as on fp32 partials.
    po, pl = _partials(3, 5, 7, 72, seed=7)
    po16 = po.to(dtype)
    out, lse = combine(po16, pl)
    ref, ref_lse = reference.combine(po16.float(), pl)
    assert rel_err(out, ref) <= 1e-6 and lse_err(lse, ref_lse) <= 1e-5
    assert torch.all(out[0, 0] == 0) and torch.isneginf(lse[0, 0])


def test_rejects_bad_partials():
    po, pl = _partials(2, 2, 3, 16)
    with pytest.raises(SplitlabError, match="partial_out"):
        combine(po.double(), pl)
    with pytest.raises(SplitlabError, match="partial_lse"):
        combine(po, pl[..., None])
    with pytest.raises(ValueError, match="partial_lse"):
        combine(po, pl[:, :, :2])
