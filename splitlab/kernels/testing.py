"""Input factories and tolerance helpers shared by the tests, the GPU checks and the sweep harness.

Inputs are fresh random draws (never zeros), block tables are shuffled so that logical and physical
pages differ, and outputs are compared with the fp64 reference by relative norm error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch

from splitlab.errors import SplitlabError
from splitlab.kernels._launch import FP8_KV_DTYPE, TORCH_DTYPE_NAMES
from splitlab.workloads import DecodeWorkload

T = TypeVar("T")
DTYPES = {name: dtype for dtype, name in TORCH_DTYPE_NAMES.items()}  # "bf16" -> torch.bfloat16, ...


def query_dtype(name: str) -> torch.dtype:
    """The dtype of q (and of the output, and so of the tolerance) for a workload's cache dtype ``name``:
    itself, or bf16 beside an fp8 cache."""
    dtype = DTYPES[name]
    return torch.bfloat16 if dtype == FP8_KV_DTYPE else dtype

# Relative norm error ||out - ref|| / ||ref|| allowed per input dtype (fp32 accumulate everywhere).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
# Max abs lse error (natural log) allowed per input dtype.
LSE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


#: An fp8 (e4m3) cache: the kernel against the fp64 reference on the same (dequantised) cache keeps q's
#: dtype's TOLERANCE; against the reference on the cache before quantisation (3 mantissa bits: relative
#: rounding up to 2^-4 per value, 3.6% rms) this bound: the interpreter measured 2.8e-2 to 4.6e-2 on the
#: CPU test shapes (fp16 and bf16 q, Dqk 48 and 576).
FP8_QUANT_TOLERANCE = 8e-2


def quantize_fp8(kv: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """``kv / kv_scale`` as an fp8 e4m3 cache (the kernels' ``kv_scale`` dequantises it)."""
    return (kv.float() / kv_scale).to(FP8_KV_DTYPE)


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


def set_key_(cache: torch.Tensor, block_table: torch.Tensor, request: int, key: int, value: float,
             *index: int) -> torch.Tensor:
    """Write ``value`` into key ``key`` of request ``request`` of a paged cache ``[num_pages, page_size, ...]``
    (at ``index`` within the key's row: a head, a column; the whole row when not given)."""
    page_size = cache.shape[1]
    page = int(block_table[request, key // page_size])
    cache[(page, key % page_size, *index)] = value
    return cache


def strided_lens(lens: list[int], how: str, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """``seq_lens`` as a non-contiguous int32 view whose neighbouring memory holds huge lengths (what a kernel
    that ignored the stride would read): ``"column"``, column 0 of a ``[B, 2]`` tensor; ``"every-other"``,
    ``t[::2]`` of a ``[2B]`` one."""
    n = len(lens)
    if how == "column":
        t = torch.full((n, 2), 1 << 30, dtype=torch.int32)
        t[:, 0] = torch.tensor(lens, dtype=torch.int32)
        view = t.to(device)[:, 0]
    elif how == "every-other":
        t = torch.full((2 * n,), 1 << 30, dtype=torch.int32)
        t[::2] = torch.tensor(lens, dtype=torch.int32)
        view = t.to(device)[::2]
    else:
        raise ValueError(f"how={how!r} is not allowed; expected 'column' or 'every-other'")
    return view


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN so that an element the kernel never writes fails the check."""
    return t.fill_(float("nan"))


def poison_unread_pages_(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: list[int], page_size: int
                         ) -> torch.Tensor:
    """NaN into every row of a paged cache ``[num_pages, page_size, ...]`` that no request reads: the rows past
    each request's end in its last page, and the pages no request uses. A kernel that reads one (a masked load
    that is not masked, an unmasked tail) then leaks NaN into its output."""
    table = block_table.cpu()
    unused = torch.ones(cache.shape[0], dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        unused[table[b, :-(-n // page_size)].long()] = False
        if n % page_size:
            cache[int(table[b, (n - 1) // page_size]), n % page_size:] = float("nan")
    cache[unused.to(cache.device)] = float("nan")
    return cache


def poison_unread_slots_(pool: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """NaN into every row of a token pool ``[num_slots, ...]`` that no valid (>= 0) index names."""
    unread = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    unread[indices[indices >= 0].long().to(pool.device)] = False
    pool[unread] = float("nan")
    return pool


def _gen(seed: int, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, device, g, scale=1.0) -> torch.Tensor:
    if g.device.type != "cpu":  # drawn where it lives, in its dtype (fast for multi-GB caches)
        t = torch.randn(shape, generator=g, dtype=dtype, device=g.device)
        return t.mul_(scale) if scale != 1.0 else t
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(dtype=dtype, device=device)


def _value_gen(seed: int, device: torch.device | str, draw_on: str) -> torch.Generator:
    """The generator of the random values: on the CPU (``draw_on="cpu"``, the same draws on every
    machine) or on ``device`` itself (``draw_on="device"``: seconds, not minutes, for a multi-GB cache)."""
    if draw_on not in ("cpu", "device"):
        raise ValueError(f"draw_on={draw_on!r} is not allowed; expected 'cpu' or 'device'")
    if draw_on == "cpu" or torch.device(device).type == "cpu":
        return _gen(seed, "cpu")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def paged_layout(seq_lens: list[int], page_size: int, *, seed: int = 0, spare_pages: int = 3,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """A shuffled block table ``[B, max_pages]`` (int32) for ``seq_lens`` and the number of physical
    pages; unused table entries point at a real page (never out of range), a few spare pages exist."""
    g = _gen(seed + 7, "cpu")
    need = [-(-n // page_size) for n in seq_lens]
    max_pages = max(max(need), 1)
    num_pages = sum(need) + spare_pages
    perm = torch.randperm(num_pages, generator=g)
    table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    at = 0
    for b, p in enumerate(need):
        table[b, :p] = perm[at:at + p].to(torch.int32)
        table[b, p:] = perm[-1].to(torch.int32)  # filler: a spare page, never read
        at += p
    return table.to(device), num_pages


def gqa_inputs(batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int, seq_lens: list[int] | int,
               *, page_size: int = 16, dtype: torch.dtype = torch.bfloat16,
               device: torch.device | str = "cpu", seed: int = 0, draw_on: str = "cpu") -> dict[str, torch.Tensor]:
    """Arguments of ``gqa_decode``: q, k_cache, v_cache, block_table, seq_lens (values drawn on the CPU,
    or on ``device`` with ``draw_on="device"``)."""
    lens = [seq_lens] * batch if isinstance(seq_lens, int) else list(seq_lens)
    g = _value_gen(seed, device, draw_on)
    table, num_pages = paged_layout(lens, page_size, seed=seed, device=device)
    return dict(
        q=_randn((batch, num_q_heads, head_dim), dtype, device, g),
        k_cache=_randn((num_pages, page_size, num_kv_heads, head_dim), dtype, device, g),
        v_cache=_randn((num_pages, page_size, num_kv_heads, head_dim), dtype, device, g),
        block_table=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
    )


def mla_inputs(batch: int, num_heads: int, head_dim_qk: int, seq_lens: list[int] | int, *,
               page_size: int = 64, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               seed: int = 0, draw_on: str = "cpu") -> dict[str, torch.Tensor]:
    """Arguments of ``mla_decode``: q, kv_cache, block_table, seq_lens (``draw_on`` as in ``gqa_inputs``)."""
    lens = [seq_lens] * batch if isinstance(seq_lens, int) else list(seq_lens)
    g = _value_gen(seed, device, draw_on)
    table, num_pages = paged_layout(lens, page_size, seed=seed, device=device)
    return dict(
        q=_randn((batch, num_heads, head_dim_qk), dtype, device, g),
        kv_cache=_randn((num_pages, page_size, head_dim_qk), dtype, device, g),
        block_table=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
    )


def sparse_mla_inputs(num_tokens: int, num_heads: int, head_dim_qk: int, topk: int, *, num_slots: int,
                      invalid_frac: float = 0.1, empty_rows: int = 0, valid: list[int] | None = None,
                      dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu", seed: int = 0,
                      draw_on: str = "cpu") -> dict[str, torch.Tensor]:
    """Arguments of ``sparse_mla_decode``: q, kv_cache [num_slots, Dqk], indices [T, topk] int32 with
    about ``invalid_frac`` of the entries -1, the last ``empty_rows`` rows all -1, and, with ``valid`` (one count
    per token: a ragged batch's top-k), every entry of row t from ``valid[t]`` on -1 (indices are always
    drawn on the CPU; q and the cache as ``draw_on`` says, see ``gqa_inputs``)."""
    g = _gen(seed, device)
    idx = torch.stack([torch.randperm(num_slots, generator=g)[:topk] for _ in range(num_tokens)]) \
        if topk <= num_slots else torch.randint(0, num_slots, (num_tokens, topk), generator=g)
    idx = torch.where(torch.rand(idx.shape, generator=g) < invalid_frac, -1, idx)
    if empty_rows:
        idx[num_tokens - empty_rows:] = -1
    if valid is not None:
        if len(valid) != num_tokens or any(not 0 <= n <= topk for n in valid):
            raise ValueError(f"valid={valid!r} is not allowed; expected {num_tokens} counts in [0, topk={topk}]")
        idx = torch.where(torch.arange(topk)[None, :] < torch.tensor(valid)[:, None], idx, -1)
    gv = g if draw_on == "cpu" else _value_gen(seed, device, draw_on)
    return dict(
        q=_randn((num_tokens, num_heads, head_dim_qk), dtype, device, gv),
        kv_cache=_randn((num_slots, head_dim_qk), dtype, device, gv),
        indices=idx.to(torch.int32).to(device),
    )


def workload_inputs(w: DecodeWorkload, *, device: torch.device | str = "cpu", seed: int = 0,
                    draw_on: str = "cpu") -> dict[str, torch.Tensor]:
    """Kernel arguments for a ``DecodeWorkload``, its per-request lengths ``w.lengths`` (a ragged batch's
    ``seq_lens``; sparse MLA: each token's valid top-k, the rest of its row -1). ``draw_on="device"`` draws the
    random values on ``device`` (what the sweep harness does for GPU-sized caches). An ``fp8_e4m3`` workload
    (MLA kernels only) gets a bf16 q and the cache drawn in bf16, then stored as fp8 (values ~N(0, 1):
    ``kv_scale`` 1, the default)."""
    dtype = query_dtype(w.dtype)
    fp8 = DTYPES[w.dtype] == FP8_KV_DTYPE
    if w.kind == "gqa":
        if fp8:
            raise SplitlabError(f"dtype={w.dtype!r} is not allowed for kind='gqa'; an fp8 cache is for the MLA "
                                "kernels")
        return gqa_inputs(w.batch, w.num_q_heads, w.num_kv_heads, w.head_dim_qk, list(w.lengths),
                          page_size=w.page_size, dtype=dtype, device=device, seed=seed, draw_on=draw_on)
    if w.kind == "mla":
        x = mla_inputs(w.batch, w.num_q_heads, w.head_dim_qk, list(w.lengths), page_size=w.page_size,
                       dtype=dtype, device=device, seed=seed, draw_on=draw_on)
    else:
        x = sparse_mla_inputs(w.batch, w.num_q_heads, w.head_dim_qk, w.topk, num_slots=w.ctx_len,
                              invalid_frac=0.0, valid=list(w.lengths) if w.ragged else None, dtype=dtype,
                              device=device, seed=seed, draw_on=draw_on)
    if fp8:
        x["kv_cache"] = quantize_fp8(x["kv_cache"], 1.0)
    return x
