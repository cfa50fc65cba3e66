"""How close a kernel's output must come to the fp64 reference, and the reference's inputs: the tolerances per dtype,
the error norms, the assertions the tests make, and ``references`` (what the sweep harness and the bench check every
point against).

Outputs are compared with the fp64 reference by relative norm error (``rel_err``) and lse by max abs error
(``lse_err``); beside an fp8 cache the reference takes q as the kernels round it (``reference_inputs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch

from splitlab.kernels._launch import FP8_KV_DTYPE
from splitlab.kernels.inputs import DTYPES
from splitlab.workloads import DecodeWorkload

T = TypeVar("T")

# Relative norm error ||out - ref|| / ||ref|| allowed per input dtype (fp32 accumulate everywhere).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
# Max abs lse error (natural log) allowed per input dtype.
LSE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


#: An fp8 (e4m3) cache: the kernel against the fp64 reference on the same (dequantised) cache keeps q's
#: dtype's TOLERANCE; against the reference on the cache before quantisation (3 mantissa bits: relative
#: rounding up to 2^-4 per value, 3.6% rms) this bound: the interpreter measured 2.8e-2 to 4.6e-2 on the
#: CPU test shapes (fp16 and bf16 q, Dqk 48 and 576).
FP8_QUANT_TOLERANCE = 8e-2


def fp8_query(q: torch.Tensor, block_h: int) -> torch.Tensor:
    """The query the MLA kernels compute with beside an fp8 cache, for the reference on the same inputs: on the
    fp8 x fp8 QK path (``mla.fp8_qk_on``) each (row, head) of q rounded to e4m3 with the kernels' scale, its
    largest magnitude / 448 (``mla.quantize_q_rows``), as fp32; q itself otherwise."""
    from splitlab.kernels.mla import E4M3_MAX, fp8_qk_on

    if not fp8_qk_on(FP8_KV_DTYPE, block_h):
        return q
    amax = q.float().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX.value, torch.ones_like(amax))
    return (q.float() / scale).to(FP8_KV_DTYPE).float() * scale


def reference_inputs(w: DecodeWorkload, inputs: dict, block_h: int | None) -> dict:
    """What the fp64 reference takes to check a launch of ``w``'s kernel on ``inputs`` with head tile
    ``block_h`` (the launch facts'): ``inputs``, with q as ``fp8_query`` rounds it for an fp8 cache."""
    if DTYPES.get(w.dtype) != FP8_KV_DTYPE or block_h is None:
        return inputs
    q = fp8_query(inputs["q"], block_h)
    return inputs if q is inputs["q"] else dict(inputs, q=q)


def references(w: DecodeWorkload, inputs: dict, compute: Callable[[dict], T]) -> Callable[[int | None], T]:
    """``ref(block_h)``: ``compute`` (a reference output) on ``reference_inputs(w, inputs, block_h)``, each
    distinct input set computed once, on first use (what the bench and the sweep harness check against)."""
    cache: dict[int | None, T] = {}

    def ref(block_h: int | None) -> T:
        x = reference_inputs(w, inputs, block_h)
        key = None if x is inputs else block_h
        if key not in cache:
            cache[key] = compute(x)
        return cache[key]

    return ref


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` if ``out`` holds a NaN or inf, or where ``ref`` is
    zero and ``out`` is not."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if out.shape != ref.shape:
        raise ValueError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return math.inf
    num, den = torch.linalg.norm(out - ref).item(), torch.linalg.norm(ref).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference of two lse tensors where finite; ``inf`` if their -inf patterns differ."""
    lse, ref = lse.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)) or torch.isnan(lse).any():
        return math.inf
    fin = torch.isfinite(ref)
    return (lse[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0


def assert_matches_reference(out: torch.Tensor, lse: torch.Tensor, ref: torch.Tensor, ref_lse: torch.Tensor,
                             dtype: torch.dtype, empty_rows: list[int]) -> None:
    """The checks of a kernel's ``(out, lse)`` against the fp64 reference's: out in ``dtype`` with the
    reference's shape, lse fp32, no NaN, relative error within ``TOLERANCE[dtype]``, lse within
    ``LSE_TOLERANCE[dtype]``; each row in ``empty_rows`` (a request or token without keys) all zero with lse
    -inf."""
    assert out.dtype == dtype and out.shape == ref.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    err, lerr = rel_err(out, ref), lse_err(lse, ref_lse)
    assert err <= TOLERANCE[dtype], f"rel_err {err:.3g} > {TOLERANCE[dtype]}"
    assert lerr <= LSE_TOLERANCE[dtype], f"lse_err {lerr:.3g}"
    for r in empty_rows:
        assert torch.all(out[r] == 0) and torch.all(torch.isneginf(lse[r]))


def assert_same_nonfinite(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """``out`` has NaN, +inf and -inf exactly where ``ref`` has them (what NaN or inf in an input must give), and
    its finite entries are within ``TOLERANCE[dtype]`` of the reference's (relative norm error)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    assert out.shape == ref.shape
    for kind in (torch.isnan, torch.isposinf, torch.isneginf):
        got, want = kind(out), kind(ref)
        assert torch.equal(got, want), f"{kind.__name__}: {int(got.sum())} entries, the reference {int(want.sum())}"
    fin = torch.isfinite(ref)
    assert rel_err(out[fin], ref[fin]) <= TOLERANCE[dtype]


def verdict(out: torch.Tensor, lse: torch.Tensor, ref: torch.Tensor, ref_lse: torch.Tensor, dtype: torch.dtype,
            nan_rows=()) -> tuple[float, float, str, str]:
    """``(rel_err, lse_err, status, why)`` of ``(out, lse)`` against the fp64 reference, for an A/B's CSV row: the
    rows in ``nan_rows`` all NaN; the others ``assert_matches_reference`` (no NaN, the dtype's tolerances, empty rows
    zero with lse -inf); ``status`` ``ok`` or ``wrong`` (``why`` says how)."""
    keep = [b for b in range(out.shape[0]) if b not in nan_rows]
    empty = [i for i, b in enumerate(keep) if bool(torch.isneginf(ref_lse[b]).all())]
    err, lerr = rel_err(out[keep], ref[keep]), lse_err(lse[keep], ref_lse[keep])
    try:
        assert_matches_reference(out[keep], lse[keep], ref[keep], ref_lse[keep], dtype, empty)
        for b in nan_rows:
            assert torch.isnan(out[b]).all() and torch.isnan(lse[b]).all(), f"request {b} is not all NaN"
    except AssertionError as e:
        return err, lerr, "wrong", str(e)[:200] or "mismatch"
    return err, lerr, "ok", ""
