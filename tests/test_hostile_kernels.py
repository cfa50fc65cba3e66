"""Hostile scalars, gradients and fp32-range data for the three decode launchers and the merge (issue 39), under
Triton's interpreter: each is refused in one ``SplitlabError`` line or handled as the fp64 reference says; no other
exception, and never a finite wrong number where validation was asked for."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
import torch

from splitlab.errors import SplitlabError
from splitlab.kernels import gqa, mla, reference
from splitlab.kernels._launch import FP32_MAX, FP32_TINY, LOG2E, SM_SCALE_MAX, SM_SCALE_MIN
from splitlab.kernels.accuracy import TOLERANCE, assert_matches_reference, assert_same_nonfinite, rel_err
from splitlab.kernels.combine import combine
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, quantize_fp8, sparse_mla_inputs
from splitlab.kernels.mla import mla_decode
from splitlab.kernels.sparse_mla import sparse_mla_decode

F32 = torch.float32
DV = 32  # the MLA families' head_dim_v (Dqk 48: 16 rope columns)


@dataclass(frozen=True)
class Family:
    """One launcher, its reference, tiny fp32 inputs (two requests or tokens attending 20 or 24 keys, and 9; no
    key shared) and its names."""

    name: str
    launch: object
    ref: object
    k_name: str
    v_name: str
    kw: dict

    def inputs(self, dtype=F32, seed=1) -> dict:
        if self.name == "gqa":
            return gqa_inputs(2, 4, 2, 16, [20, 9], page_size=8, dtype=dtype, seed=seed)
        if self.name == "mla":
            return mla_inputs(2, 4, 48, [20, 9], page_size=8, dtype=dtype, seed=seed)
        x = sparse_mla_inputs(2, 4, 48, 24, num_slots=40, dtype=dtype, seed=seed, invalid_frac=0.0)
        perm = torch.randperm(40, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        x["indices"][0], x["indices"][1] = perm[:24], -1  # token 0 attends 24 slots, token 1 9 others
        x["indices"][1, :9] = perm[24:33]
        return x

    def keys(self, x: dict, r: int) -> int:
        """How many keys request (token) ``r`` attends."""
        return int(x["seq_lens"][r]) if "seq_lens" in x else int((x["indices"][r] >= 0).sum())

    def set_v(self, x: dict, value: float, r: int | None = None) -> None:
        """Every V entry request ``r`` (None: every request) can attend set to ``value``; the MLA families' q is
        zeroed on the V columns (K is the whole latent row) so that their scores stay those of the rope columns."""
        rows = [r] if r is not None else range(x["q"].shape[0])
        for b in rows:
            if self.name == "gqa":
                x["v_cache"][x["block_table"][b].long()] = value
            elif self.name == "mla":
                x["kv_cache"][x["block_table"][b].long(), :, :DV] = value
            else:
                idx = x["indices"][b]
                x["kv_cache"][idx[idx >= 0].long(), :DV] = value
        if self.name != "gqa":
            x["q"][..., :DV] = 0.0

    def run(self, x: dict, **kw):
        return self.launch(**x, **{**self.kw, **kw})

    def reference(self, x: dict, **kw):
        return self.ref(**x, **{**self.kw, **kw})


FAMILIES = [
    Family("gqa", gqa_decode, reference.gqa_decode, "k_cache", "v_cache", dict(num_splits=2, block_n=16)),
    Family("mla", mla_decode, reference.mla_decode, "kv_cache", "kv_cache", dict(head_dim_v=DV, num_splits=2)),
    Family("sparse_mla", sparse_mla_decode, reference.sparse_mla_decode, "kv_cache", "kv_cache",
           dict(head_dim_v=DV, num_splits=2, block_k=16)),
]
IDS = [f.name for f in FAMILIES]


def refused(fn, arg: str) -> str:
    """``fn()`` raises a one-line ``SplitlabError`` whose message starts with ``arg``; returns the message."""
    with pytest.raises(SplitlabError) as exc:
        fn()
    msg = str(exc.value)
    assert msg.startswith(arg) and "\n" not in msg, msg
    return msg


def check(fam: Family, x: dict, empty=(), **kw) -> None:
    """The launch with ``kw`` matches the fp64 reference within the fp32 tolerance."""
    out, lse = fam.run(x, return_lse=True, **kw)
    assert_matches_reference(out, lse, *fam.reference(x, return_lse=True, **kw), F32, list(empty))


def no_finite_wrong_row(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Every row of ``out`` is either not finite or the reference's (what an unvalidated launch promises)."""
    for r in range(out.shape[0]):
        for h in range(out.shape[1]):
            if torch.isfinite(out[r, h]).all():
                assert rel_err(out[r, h], ref[r, h]) <= TOLERANCE[F32], (r, h)


# --- 1. sm_scale at fp32's edges: the kernels take sm_scale * log2(e) as one fp32 --------------------------------


def edge_inputs(fam: Family, exponent: int) -> dict:
    """Inputs whose scores at ``sm_scale * log2(e) = 2^-exponent`` (within rounding) are of order 1 with every
    product of the QK dot a normal fp32: K entries of magnitude in [1, 2) with random signs, and each query head
    one non-zero column, (1 + u) * 2^exponent."""
    x = fam.inputs()
    g = torch.Generator().manual_seed(5)
    k = x["k_cache"] if fam.name == "gqa" else x["kv_cache"]
    mag = 1.0 + torch.rand(k.shape, generator=g)
    k.copy_(torch.where(torch.rand(k.shape, generator=g) < 0.5, -mag, mag))
    q = x["q"]
    q.zero_()
    for h in range(q.shape[1]):
        q[:, h, (3 * h) % q.shape[2]] = (1.0 + torch.rand(q.shape[0], generator=g)) * 2.0 ** exponent
    return x


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_sm_scale_at_the_fp32_edges(fam):
    """The largest and the smallest accepted scale give the reference's result (scores of order 1, every dot
    product normal); the next double out, fp32's max, a subnormal and 0 are refused in one line. Before, 1e300
    passed the "positive finite" check: NaN rows (GQA) or the interpreter's AssertionError (MLA, whose scale the
    interpreter then typed fp64); a scale below fp32's normal range did the same."""
    assert LOG2E == gqa.LOG2E == mla.LOG2E  # the product checked is the one launched
    assert SM_SCALE_MAX * LOG2E <= FP32_MAX < math.nextafter(SM_SCALE_MAX, math.inf) * LOG2E
    assert SM_SCALE_MIN * LOG2E >= FP32_TINY > math.nextafter(SM_SCALE_MIN, 0) * LOG2E
    check(fam, edge_inputs(fam, -127), sm_scale=SM_SCALE_MAX)  # 2^-127 * k * 2^128: scores 2 k in [-4, 4]
    check(fam, edge_inputs(fam, 125), sm_scale=SM_SCALE_MIN)  # 2^125 * k * 2^-126: scores k / 2
    x = fam.inputs()
    for s in (math.nextafter(SM_SCALE_MAX, math.inf), FP32_MAX, 1e300, math.inf, math.nextafter(SM_SCALE_MIN, 0),
              1e-45, 5e-324, 0.0, -0.0, -1.0, math.nan):
        msg = refused(lambda s=s: fam.run(x, sm_scale=s), "sm_scale=")
        assert "not allowed" in msg and repr(SM_SCALE_MAX) in msg, msg


# --- 3. the type of a scale ---------------------------------------------------------------------------------------


HOSTILE_SCALES = ["abc", "0.5", True, np.True_, 1j, torch.tensor(0.5), torch.ones(2, 2), np.array(0.5), [0.5],
                  10 ** 400, object()]


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_sm_scale_must_be_a_real_number(fam):
    """A string, bool, complex, array or tensor sm_scale is refused in one line naming it (before: a bare
    ``ValueError``/``TypeError`` from ``float()``, or True taken as 1.0, a tensor read silently); an int, a numpy
    scalar or a Fraction is the float it equals."""
    x = fam.inputs()
    for s in HOSTILE_SCALES:
        msg = refused(lambda s=s: fam.run(x, sm_scale=s), "sm_scale=")
        assert len(msg) < 400, msg  # a 400-digit int stays short
    want = fam.run(x, sm_scale=0.25)
    for s in (np.float32(0.25), np.float64(0.25), Fraction(1, 4)):
        assert torch.equal(fam.run(x, sm_scale=s), want), repr(s)
    assert torch.equal(fam.run(x, sm_scale=1), fam.run(x, sm_scale=1.0))


@pytest.mark.parametrize("fam", FAMILIES[1:], ids=IDS[1:])
def test_kv_scale_is_a_real_number_in_fp32s_normal_range(fam):
    """An fp8 cache's kv_scale: the same types refused (before: ``float('abc')``'s bare ValueError), a value past
    fp32's range or below its normal one refused, and a product sm_scale * kv_scale * log2(e) past fp32 refused
    naming both."""
    x = fam.inputs()
    x["q"], x["kv_cache"] = x["q"].bfloat16(), quantize_fp8(x["kv_cache"], 1.0)
    for s in HOSTILE_SCALES:
        refused(lambda s=s: fam.run(x, kv_scale=s), "kv_scale=")
    for s in (1e39, 1e-39, 0.0, math.inf):
        refused(lambda s=s: fam.run(x, kv_scale=s), "kv_scale=")
    msg = refused(lambda: fam.run(x, kv_scale=1e10, sm_scale=1e30), "sm_scale=")
    assert "kv_scale=10000000000.0" in msg


# --- 2. V near fp32's maximum, and scores past it: refused where validation is asked for ------------------------


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: overflow
def test_v_near_fp32_max_is_refused_under_validation(fam, splits):
    """V at 3/4 of fp32's max: the unnormalised fp32 sum of p * v overflows (inf) where the fp64 reference is
    finite. Validation asked for refuses it in one line naming the bound; unvalidated, no row is finite and wrong.
    Request 0 holds a NaN in V besides (the reference's NaN row): validation lets it be and names request 1."""
    x = fam.inputs()
    fam.set_v(x, 0.75 * FP32_MAX, r=1)
    fam.set_v(x, math.nan, r=0)
    ref = fam.reference(x)
    assert torch.isfinite(ref[1]).all() and torch.isnan(ref[0]).all()
    msg = refused(lambda: fam.run(x, num_splits=splits, validate=True), fam.v_name)
    n = fam.keys(x, 1)
    assert f"among the {n} keys request 1 attends" in msg and f"|v| <= {FP32_MAX / (2 * n):.4g}" in msg, msg
    out = fam.run(x, num_splits=splits, validate=False)
    assert not torch.isfinite(out[1]).all()
    no_finite_wrong_row(out, ref)


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_v_within_the_documented_bound_is_exact(fam):
    """V of magnitude just under the documented bound 3.4e38 / (2 n), n the most keys a request attends, gives
    the reference's result, and validation accepts it."""
    x = fam.inputs()
    n = max(fam.keys(x, r) for r in range(2))
    fam.set_v(x, 0.99 * FP32_MAX / (2 * n))
    check(fam, x, validate=True)


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_scores_past_fp32_are_refused_under_validation(fam):
    """sm_scale = 1e38 is a normal fp32 (accepted), but times q.k it overflows the fp32 scores: NaN rows where the
    reference is finite. And where every score of a request falls below -3.4e38 the kernels see no key: a zero row
    with lse -inf, silently. Validation asked for refuses both, naming sm_scale."""
    x = fam.inputs()
    ref = fam.reference(x, sm_scale=1e38)
    assert torch.isfinite(ref).all()
    refused(lambda: fam.run(x, sm_scale=1e38, validate=True), "sm_scale=1e+38")
    no_finite_wrong_row(fam.run(x, sm_scale=1e38), ref)

    x = edge_inputs(fam, 2)  # q one column of (1 + u) * 4; K in -[1, 2): every score below -5.7e38
    k = x["k_cache"] if fam.name == "gqa" else x["kv_cache"]
    k.abs_().neg_()
    ref, ref_lse = fam.reference(x, sm_scale=1e38, return_lse=True)
    assert torch.isfinite(ref).all() and torch.isfinite(ref_lse).all()
    out, lse = fam.run(x, sm_scale=1e38, return_lse=True)
    assert torch.isneginf(lse).all()  # what the kernels give unvalidated: the documented silent case
    refused(lambda: fam.run(x, sm_scale=1e38, validate=True), "sm_scale=1e+38")


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_inputs_pass_validation_as_the_reference_has_them(fam):
    """A NaN or inf in the inputs a row attends is the reference's non-finite row, not an overflow: validation
    returns it as it is (and the finite rows right)."""
    x = fam.inputs()
    fam.set_v(x, math.inf, r=0)
    ref = fam.reference(x)
    assert not torch.isfinite(ref[0]).all() and torch.isfinite(ref[1]).all()
    assert_same_nonfinite(fam.run(x, validate=True), ref, F32)


# --- 4. inputs that require grad: the kernels have no backward ---------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_inputs_that_require_grad_are_refused_while_autograd_records(fam):
    """Before, the output came back without a gradient, no word. Under no_grad / inference_mode the same tensors
    are read like any other."""
    x = fam.inputs()
    want = fam.run(x)
    for name in dict.fromkeys(("q", fam.k_name, fam.v_name)):
        y = dict(x, **{name: x[name].clone().requires_grad_()})
        msg = refused(lambda y=y: fam.run(y), name)
        assert "requires grad" in msg and "no backward" in msg, msg
        with torch.no_grad():
            assert torch.equal(fam.run(y), want)
        with torch.inference_mode():
            assert torch.equal(fam.run(y), want)


def test_the_merge_refuses_partials_that_require_grad():
    g = torch.Generator().manual_seed(0)
    po, pl = torch.randn(2, 3, 4, 16, generator=g), torch.randn(2, 3, 4, generator=g)
    want = combine(po, pl)
    refused(lambda: combine(po.clone().requires_grad_(), pl), "partial_out")
    refused(lambda: combine(po, pl.clone().requires_grad_()), "partial_lse")
    refused(lambda: combine(po, pl, out=torch.empty(2, 3, 16, requires_grad=True)), "out")
    with torch.no_grad():
        got = combine(po.clone().requires_grad_(), pl.clone().requires_grad_())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- any hostile scalar: a SplitlabError line or a right result, nothing else ------------------------------------


SCALAR_ARGS = {"gqa": ["sm_scale", "num_splits", "block_n", "num_warps", "num_stages", "validate"],
               "mla": ["sm_scale", "num_splits", "block_n", "block_h", "num_warps", "num_stages", "head_dim_v",
                       "validate"],
               "sparse_mla": ["sm_scale", "num_splits", "block_k", "block_h", "num_warps", "head_dim_v",
                              "validate"]}
FUZZ = ["abc", True, 1j, math.nan, math.inf, -1, 0, 10 ** 400, 1e300, torch.tensor(2), np.float32(math.nan), [1],
        object()]


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_hostile_scalars_give_one_line_or_the_right_result(fam):
    x = fam.inputs()
    for arg in SCALAR_ARGS[fam.name]:
        for v in FUZZ:
            try:
                out, lse = fam.run(x, return_lse=True, **{arg: v})
            except SplitlabError as e:
                assert str(e).startswith(arg) and "\n" not in str(e), (arg, v, str(e))
                continue
            # Accepted (a 0-d integer tensor as a knob is its int): the reference's result.
            assert_matches_reference(out, lse, *fam.reference(x, return_lse=True, **{arg: v}), F32, [])
