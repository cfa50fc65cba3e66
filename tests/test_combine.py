"""The shared split-K combine against the fp64 reference, under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import combine as combine_mod
from splitlab.kernels import reference
from splitlab.kernels.accuracy import TOLERANCE, assert_same_nonfinite, lse_err, rel_err
from splitlab.kernels.combine import combine, combine_grid, combine_tile
from splitlab.kernels.inputs import poison_


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


# --- NaN, empty splits, and the output buffers ------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: exp(NaN)
@pytest.mark.parametrize("splits", [3, 150])  # one chunk of splits; several (the NaN in a later chunk)
def test_a_nan_lse_gives_nan_where_the_reference_does(splits):
    """One NaN partial lse (a split that attended a NaN key): that (row, head) is NaN in out and lse, as in the
    reference; the empty splits (lse -inf, NaN garbage rows) beside it still contribute nothing elsewhere. It used
    to be skipped like an empty split: no NaN where the reference has 40."""
    po, pl = _partials(2, 3, splits, 40, seed=11)
    pl[1, 2, splits - 2] = float("nan")
    out, lse = combine(po, pl)
    ref, ref_lse = reference.combine(po, pl)
    assert torch.isnan(ref[1, 2]).all() and torch.isnan(ref_lse[1, 2])
    assert_same_nonfinite(out, ref, torch.float32)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max() <= 1e-5
    assert torch.all(out[0, 0] == 0) and torch.isneginf(lse[0, 0])  # the all-empty row


def test_nan_in_a_live_partial_reaches_its_column_only():
    po, pl = _partials(2, 2, 4, 24, seed=12, empty_frac=0.0)
    po[1, 1, 2, 5] = float("nan")
    out, lse = combine(po, pl)
    assert torch.isnan(out[1, 1, 5]) and torch.isnan(out).sum() == 1 and torch.isfinite(lse[1]).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_positive_infinite_lse_is_not_finite_either():
    po, pl = _partials(2, 2, 3, 16, seed=13, empty_frac=0.0)
    pl[1, 1, 0] = float("inf")
    out, lse = combine(po, pl)
    assert torch.isnan(out[1, 1]).all() and not torch.isfinite(lse[1, 1])
    assert torch.isfinite(out[1, 0]).all() and torch.isfinite(lse[1, 0])


def _bad_out_cases():
    rows, heads, dv = 2, 3, 16
    f32 = dict(dtype=torch.float32)
    return [
        ("out too small", dict(out=torch.empty(rows, heads, dv - 1, **f32)), r"^out has shape \(2, 3, 15\)"),
        ("out too few rows", dict(out=torch.empty(1, heads, dv, **f32)), r"^out has shape"),
        ("out int32", dict(out=torch.empty(rows, heads, dv, dtype=torch.int32)), r"^out has dtype torch.int32"),
        ("out float64", dict(out=torch.empty(rows, heads, dv, dtype=torch.float64)), r"^out has dtype"),
        ("out 2-d", dict(out=torch.empty(rows * heads, dv, **f32)), r"^out has shape"),
        ("out not a tensor", dict(out=[0.0] * 96), r"^out is a list"),
        ("out on meta", dict(out=torch.empty(rows, heads, dv, device="meta", **f32)), r"^out is on meta"),
        ("out overlapping", dict(out=torch.empty(1, 1, dv, **f32).expand(rows, heads, dv)),
         r"^out has strides \(0, 0, 1\) whose elements may overlap"),
        ("out_dtype int", dict(out_dtype=torch.int32), r"^out_dtype=torch.int32 is not allowed"),
        ("out_dtype mismatch", dict(out=torch.empty(rows, heads, dv, **f32), out_dtype=torch.float16),
         r"^out has dtype torch.float32; expected out_dtype"),
        ("lse too small", dict(lse=torch.empty(rows, heads - 1, **f32)), r"^lse has shape"),
        ("lse fp16", dict(lse=torch.empty(rows, heads, dtype=torch.float16)), r"^lse has dtype"),
        ("lse overlapping", dict(lse=torch.empty(rows, 1, **f32).expand(rows, heads)), r"^lse has strides"),
    ]


@pytest.mark.parametrize("name,kwargs,message", _bad_out_cases(), ids=[c[0] for c in _bad_out_cases()])
def test_bad_output_buffers_are_refused(name, kwargs, message):
    """``out`` / ``lse`` of the wrong shape, dtype, device or overlapping strides: a one-line SplitlabError (an out
    too small used to segfault, an int32 one was written)."""
    po, pl = _partials(2, 3, 4, 16)
    with pytest.raises(SplitlabError, match=message) as exc:
        combine(po, pl, **kwargs)
    assert "\n" not in str(exc.value)


def test_outputs_sharing_memory_with_the_partials_are_refused():
    po, pl = _partials(2, 3, 4, 16)
    with pytest.raises(SplitlabError, match="^out shares memory with partial_out"):
        combine(po, pl, out=po[:, :, 0])
    with pytest.raises(SplitlabError, match="^lse shares memory with partial_lse"):
        combine(po, pl, lse=pl[:, :, 1])
    buf = torch.empty(2 * 3 * 16 + 6)
    with pytest.raises(SplitlabError, match="^lse shares memory with out"):
        combine(po, pl, out=buf[:96].view(2, 3, 16), lse=buf[90:96].view(2, 3))


def test_strided_output_buffers_are_honoured():
    po, pl = _partials(2, 3, 4, 16, seed=14)
    out = poison_(torch.empty(16, 3, 2)).permute(2, 1, 0)  # [2, 3, 16] with the columns outermost
    lse = poison_(torch.empty(3, 2)).t()
    combine(po, pl, out=out, lse=lse)
    ref, ref_lse = reference.combine(po, pl)
    assert rel_err(out, ref) <= 1e-6 and lse_err(lse, ref_lse) <= 1e-5


def test_overlap_and_span_rules():
    from splitlab.kernels._launch import check_spans, overlapping

    assert not overlapping(torch.empty(2, 3, 4)) and not overlapping(torch.empty(4, 3).t())
    assert not overlapping(torch.empty(1, 5).expand(1, 5)) and not overlapping(torch.empty(6, 8)[:, ::2])
    assert overlapping(torch.empty(3, 1).expand(3, 4))
    assert overlapping(torch.empty(7).as_strided((3, 3), (1, 2)))  # element (2, 0) is element (0, 1)
    check_spans("x", torch.empty_strided((2, 2**16), (1, 2**15), device="meta"), (1,))  # (2^16 - 1) * 2^15 < 2^31
    with pytest.raises(SplitlabError, match=r"^x has shape \(2, 65537\) and strides \(1, 32768\): dimension 1 spans"):
        check_spans("x", torch.empty_strided((2, 2**16 + 1), (1, 2**15), device="meta"), (1,))


def test_rejects_empty_head_dim():
    po, pl = _partials(2, 2, 3, 16)
    with pytest.raises(SplitlabError, match="^partial_out has shape"):
        combine(po[..., :0], pl)
