"""Paged GQA/MHA/MQA split-K decode: one Triton program per (request, kv head, split).

Every query head of a kv head's group shares one program, so each K/V tile is read from HBM once per kv
head (not once per query head): the group forms the M side of ``tl.dot`` (``BLOCK_G`` rows, at least 16,
the smallest M of an NVIDIA MMA; rows past the group are masked). Each request splits its *own* keys into
``num_splits`` pieces inside the kernel (tile-aligned), so ragged batches balance without a host sync.

    partial:  grid (B * Hkv, S)   ->  S == 1: out [B, Hq, D] (q's dtype) and lse [B, Hq] directly
                                      S > 1:  fp32 partials [B, Hq, S, D] and [B, Hq, S] ...
    combine:  (S > 1 only)        ->  ... merged by ``splitlab.kernels.combine.combine``

Bytes moved per program (elt = 2 for bf16/fp16, 4 for fp32; n = the split's keys; G = group size):
    K and V:      2 * n * D * elt          (the whole point: read once per kv head)
    block table:  n * 4 when page_size < BLOCK_N (one int32 per key, mostly repeats that hit L1), else
                  n / BLOCK_N * 4 (one entry per tile); loaded a tile ahead so K/V loads stay pipelined; plus
                  n / page_size * 4 read once before the loop to check the entries (paging.scan_pages)
    q:            G * D * elt
    writes:       G * D * (elt if S == 1 else 4) + G * 4
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError, bad
from splitlab.intmath import next_power_of_two
from splitlab.kernels import _launch
from splitlab.kernels._launch import (
    FLOAT_DTYPES,
    TORCH_DTYPE_NAMES,
    LaunchFacts,
    check_knob,
    check_no_grad,
    check_paged_launch,
    check_pow2,
    check_result,
    check_same_dtype,
    check_spans,
    check_tensor,
    gather_keys,
    interpret_upcast,
    launch_plan,
    planning_lengths,
    resolve_device,
    resolve_sm_scale,
    validate_setting,
)
from splitlab.kernels.combine import combine_grid, launch_combine
from splitlab.kernels.paging import any_bad, checked_len, num_tiles, poison, scan_pages, tile_pages
from splitlab.workloads import DecodeWorkload

__all__ = ["gqa_decode", "gqa_launch_facts", "default_knobs"]

LOG2E = 1.4426950408889634  # log2(e): scores are kept in the log2 domain so the kernel can use exp2
LN2 = tl.constexpr(0.6931471805599453)  # ln(2), back to a natural-log lse (a jit global must be constexpr)
FLT_MAX = tl.constexpr(3.4028234663852886e38)  # the largest finite fp32: the running max's start
MAX_SPLITS = 65535  # the grid's y dimension holds the splits (CUDA limit)
#: The order the grid issues its programs in: (request x kv head) fastest, then split, so every request's CTAs of
#: split 0 go first (``planners.splitlab.REQUEST_MAJOR`` restates it for the planner's schedule of a ragged batch).
GRID_ORDER = "split-major"


@triton.jit
def _gqa_partial_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale,  # sm_scale * log2(e)
    num_kv_heads, group, num_splits,
    seq_lens_stride, num_pages, max_keys,  # max_keys: block_table's columns * PAGE_SIZE
    q_stride_b, q_stride_h, q_stride_d,
    k_stride_p, k_stride_s, k_stride_h, k_stride_d,
    v_stride_p, v_stride_s, v_stride_h, v_stride_d,
    bt_stride_b, bt_stride_p,
    out_stride_b, out_stride_h, out_stride_s, out_stride_d,
    lse_stride_b, lse_stride_h, lse_stride_s,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,  # query heads per program (the group, padded to a power of two >= 16)
    BLOCK_N: tl.constexpr,  # keys per tile
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two >= 16
    UPCAST: tl.constexpr,  # interpreter + bf16: compute in fp32 (the interpreter's bf16 math is broken)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 operands, None (the backend default) for 16-bit
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    b64 = b.to(tl.int64)

    # This request's keys, split into num_splits tile-aligned pieces: [start, end). A length outside
    # [0, max_keys] reads nothing and stores NaN (paging.checked_len).
    seq_len, bad_len = checked_len(tl.load(seq_lens_ptr + b64 * seq_lens_stride), max_keys)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < group
    mask_d = offs_d < HEAD_DIM  # all true (and folded) when HEAD_DIM is a power of two >= 16
    heads = kvh * group + offs_g

    # Q tile [BLOCK_G, BLOCK_D]: G * D * elt bytes, read once per program.
    q_ptrs = q_ptr + b64 * q_stride_b + heads[:, None] * q_stride_h + offs_d[None, :] * q_stride_d
    q = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    bt_row = bt_ptr + b64 * bt_stride_b
    k_head = k_ptr + kvh.to(tl.int64) * k_stride_h
    v_head = v_ptr + kvh.to(tl.int64) * v_stride_h

    # Running max, log2 domain. It starts at -FLT_MAX, not -inf: a tile whose keys are all masked (an empty split's
    # one tile) or score -inf (an infinite key) then leaves it finite, so m_i - m_new and s - m_new never meet
    # -inf - -inf, with no per-tile select (which cost 3.5% on MQA-128 on the H200). No finite score is below it.
    m_i = tl.full([BLOCK_G], -FLT_MAX, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)

    # The block-table entries of the next tile are loaded one iteration ahead and carried in registers,
    # so the K/V addresses of a tile do not depend on a load of the same iteration (see splitlab.kernels.paging).
    # An entry out of the cache is clamped into it (paging.tile_pages); the split's entries are read once more
    # before the loop (paging.scan_pages), and one out of range makes the request NaN (any_bad). At least one tile
    # (paging.num_tiles): an empty split runs one masked tile that reads nothing and leaves the state as it was.
    seen = scan_pages(bt_row, bt_stride_p, start, end, PAGE_SIZE)
    page_next, _ = tile_pages(bt_row, bt_stride_p, start, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N)
    for t in range(0, num_tiles(start, end, BLOCK_N)):
        start_n = start + t * BLOCK_N
        pos = start_n + offs_n
        mask_n = pos < end
        page = page_next
        page_next, _ = tile_pages(bt_row, bt_stride_p, start_n + BLOCK_N, end, offs_n, num_pages, PAGE_SIZE, BLOCK_N)
        # Paged gather: token pos lives in page block_table[b, pos // PAGE_SIZE], slot pos % PAGE_SIZE.
        slot = pos % PAGE_SIZE
        k_rows = page * k_stride_p + slot * k_stride_s
        v_rows = page * v_stride_p + slot * v_stride_s
        kv_mask = mask_n[:, None] & mask_d[None, :]

        # K tile [BLOCK_N, BLOCK_D]: BLOCK_N * D * elt bytes.
        k = tl.load(k_head + k_rows[:, None] + offs_d[None, :] * k_stride_d, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N], log2
        s = tl.where(mask_n[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)  # 0 (underflow) on the first tile with a live key
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        # V tile [BLOCK_N, BLOCK_D]: BLOCK_N * D * elt bytes.
        v = tl.load(v_head + v_rows[:, None] + offs_d[None, :] * v_stride_d, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Epilogue: a split without keys writes zeros and lse = -inf (the combine gives it weight 0); a NaN among the
    # keys, a length or a page out of range give NaN (which the combine propagates).
    l_i = poison(l_i, bad_len | any_bad(seen, num_pages, True))
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)

    out_ptrs = (out_ptr + b64 * out_stride_b + split * out_stride_s
                + heads[:, None] * out_stride_h + offs_d[None, :] * out_stride_d)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
    lse_ptrs = lse_ptr + b64 * lse_stride_b + split * lse_stride_s + heads * lse_stride_h
    tl.store(lse_ptrs, lse, mask=mask_g)


# --- defaults ------------------------------------------------------------------------------------------
# Starting points for Hopper, tuned on the H200 where noted; register and shared-memory figures
# are from compiling for sm_90 with triton 3.6 (ptxas resource usage), not from runs:
#   BLOCK_N   64 keys per tile for 16-bit D <= 128 (K+V tile 32 KiB at D=128; ~105 registers, 38 KiB of shared
#             memory at 2 stages); 32 for D > 128 or more than 128 query heads per program (the [BLOCK_G, BLOCK_N]
#             scores and [BLOCK_G, D] accumulator crowd the registers); halved for fp32 (at 64, D=128 spills).
#   num_warps 4; 8 once the fp32 accumulator BLOCK_G * BLOCK_D reaches 128 x 128 (MQA-128 at D=128).
#   num_stages 3: two K/V tiles in flight (72 KiB of shared memory at D=128, BLOCK_N=64); on the H200 it was
#             the best or within noise of the best tile at every point of bench run 2 (BENCHMARKS.md).
def default_knobs(group: int, head_dim: int, dtype: str = "bf16") -> dict[str, int]:
    """The launcher's defaults for ``group`` query heads per kv head at ``head_dim`` and ``dtype``:
    ``block_n``, ``num_warps``, ``num_stages`` (and the derived tile sizes ``block_g``, ``block_d``)."""
    block_g = max(16, next_power_of_two(group))
    block_d = max(16, next_power_of_two(head_dim))
    block_n = 32 if head_dim > 128 or block_g > 128 else 64
    num_stages = 3  # two K/V tiles in flight: best or within noise of best at every H200 point of bench run 2
    if dtype == "fp32":
        block_n, num_stages = max(16, block_n // 2), 2
    num_warps = 8 if block_g * block_d >= 128 * 128 else 4
    return dict(block_g=block_g, block_d=block_d, block_n=block_n, num_warps=num_warps, num_stages=num_stages)


def gqa_launch_facts(w: DecodeWorkload, *, num_splits: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     device: DeviceSpec | str | None = None) -> LaunchFacts:
    """The partial launch (and combine launch) ``gqa_decode`` makes for ``w``, resolved exactly as the
    launcher resolves it, without launching. ``num_splits=None`` asks ``splitlab.planners.default_plan``
    on ``device`` (a ``DeviceSpec`` or preset name; ``None``: the GPU torch sees, else the H200 preset).
    Only the planner reads ``w.ctx_len`` / ``w.seq_lens``."""
    if w.kind != "gqa":
        raise SplitlabError(f"kind={w.kind!r} is not allowed; expected 'gqa'")
    if w.head_dim_v != w.head_dim_qk:
        raise SplitlabError(f"head_dim_v={w.head_dim_v} is not allowed; expected head_dim_qk={w.head_dim_qk}")
    d = default_knobs(w.group, w.head_dim_qk, w.dtype)
    if num_splits is None:
        p = launch_plan(w, device)
        num_splits = p.num_splits
        if block_n is None and p.block_n is not None:
            block_n = p.block_n
    num_splits = check_knob("num_splits", num_splits, lo=1, hi=MAX_SPLITS)
    block_n = check_pow2("block_n", d["block_n"] if block_n is None else block_n, lo=16, hi=256)
    num_warps = check_pow2("num_warps", d["num_warps"] if num_warps is None else num_warps, lo=1, hi=16)
    num_stages = check_knob("num_stages", d["num_stages"] if num_stages is None else num_stages, lo=1, hi=8)
    return LaunchFacts(
        kernel="gqa",
        grid=(w.batch * w.num_kv_heads, num_splits),
        num_splits=num_splits, num_warps=num_warps, num_stages=num_stages,
        block_n=block_n, block_h=d["block_g"],
        combine_grid=None if num_splits == 1 else combine_grid(w.batch, w.num_q_heads, num_splits, w.head_dim_v),
    )


@functools.lru_cache(maxsize=1024)
def _fixed_split_facts(batch: int, hq: int, hkv: int, d: int, page_size: int, dtype: str, num_splits: object,
                       block_n: object, num_warps: object, num_stages: object, _knob_types: tuple
                       ) -> LaunchFacts:
    """``gqa_launch_facts`` for an explicit ``num_splits`` (no planner, so ctx_len is not read), memoised:
    the launcher's host time matters at decode sizes (a launch is ~10 us of GPU time)."""
    w = DecodeWorkload(kind="gqa", batch=batch, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=d, head_dim_v=d,
                       ctx_len=1, page_size=page_size, dtype=dtype)
    return gqa_launch_facts(w, num_splits=num_splits, block_n=block_n, num_warps=num_warps,
                            num_stages=num_stages)


def _check_inputs(q, k_cache, v_cache, block_table, seq_lens=None) -> None:
    """The launch's tensors checked, each refused in one line (``seq_lens`` where the launch reads it: the work-list
    launcher takes the lengths from its schedule)."""
    check_tensor("q", q, 3, dtypes=FLOAT_DTYPES)
    dev = q.device
    check_tensor("k_cache", k_cache, 4, dtypes=FLOAT_DTYPES, device=dev)
    check_tensor("v_cache", v_cache, 4, dtypes=FLOAT_DTYPES, device=dev)
    check_same_dtype(q, k_cache=k_cache, v_cache=v_cache)
    check_no_grad(q=q, k_cache=k_cache, v_cache=v_cache)
    check_tensor("block_table", block_table, 2, dtypes=(torch.int32,), device=dev)
    if seq_lens is not None:
        check_tensor("seq_lens", seq_lens, 1, dtypes=(torch.int32,), device=dev)
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, Dk = k_cache.shape
    for name, n in (("batch (q.shape[0])", B), ("num_q_heads (q.shape[1])", Hq), ("head_dim (q.shape[2])", D),
                    ("num_pages (k_cache.shape[0])", num_pages), ("page_size (k_cache.shape[1])", page_size),
                    ("num_kv_heads (k_cache.shape[2])", Hkv)):
        if n < 1:
            raise bad(name, n, "an integer >= 1")
    if Dk != D:
        raise SplitlabError(f"k_cache has head dim {Dk} (shape {tuple(k_cache.shape)}); "
                            f"expected q's head dim {D}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise SplitlabError(f"v_cache has shape {tuple(v_cache.shape)}; expected k_cache's shape "
                            f"{tuple(k_cache.shape)}")
    if Hq % Hkv:
        raise SplitlabError(f"q has {Hq} query heads; expected a multiple of k_cache's {Hkv} kv heads")
    if block_table.shape[0] != B:
        raise SplitlabError(f"block_table has shape {tuple(block_table.shape)}; expected [{B}, max_pages]")
    if seq_lens is not None and tuple(seq_lens.shape) != (B,):
        raise SplitlabError(f"seq_lens has shape {tuple(seq_lens.shape)}; expected [{B}]")
    _launch.check_launch_device("q", q)
    # Dimensions the kernel indexes in 32 bits (batch, page and kv-head offsets are 64-bit).
    for name, t, dims in (("q", q, (1, 2)), ("k_cache", k_cache, (1, 3)), ("v_cache", v_cache, (1, 3)),
                          ("block_table", block_table, (1,))):
        check_spans(name, t, dims)


def gqa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, *, num_splits: int | None = None, block_n: int | None = None,
               num_warps: int | None = None, num_stages: int | None = None, sm_scale: float | None = None,
               return_lse: bool = False, validate: bool | None = None):
    """Paged GQA/MHA/MQA decode, one query token per request.

    q [B, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; block_table [B, max_pages] int32 (request
    b's token i lives in page ``block_table[b, i // page_size]``, slot ``i % page_size``); seq_lens [B] int32
    (0 allowed). Any strides (views, a column of a wider tensor). Returns out [B, Hq, D] in q's dtype, or
    ``(out, lse)`` with lse fp32 [B, Hq] natural log (-inf, and an all-zero out row, for a request without keys;
    NaN rows where a key the request attends holds NaN, as the reference gives).

    ``num_splits=None`` asks ``splitlab.planners.default_plan`` on the GPU q lives on (the H200 preset when
    interpreting on the CPU) for the batch as it is: it reads ``seq_lens`` in one host sync and plans with every
    request's length (``DecodeWorkload.seq_lens``; a batch of only empty requests as requests of 1 key,
    ``_launch.planning_lengths``). Pass ``num_splits`` under CUDA graphs.

    ``validate`` (``_launch.validate_setting``: None follows ``SPLITLAB_VALIDATE``, else the default) refuses
    lengths outside ``[0, max_pages * page_size]`` and block-table entries a request reads outside
    ``[0, num_pages)``. Default: on with ``num_splits=None`` (within its one sync; the length check is always
    made there), off with an explicit ``num_splits`` (no sync). Unvalidated, such inputs are never read past:
    their requests come out NaN.

    fp32 range (``_launch``'s docstring): ``sm_scale`` (default ``1/sqrt(D)``) is a real number in
    ``[_launch.SM_SCALE_MIN, _launch.SM_SCALE_MAX]`` (about [8.1e-39, 2.4e38]: ``sm_scale * log2(e)`` a normal
    fp32); the kernel computes in fp32, so the scores ``sm_scale * q.k`` must stay within fp32 and V within
    ``|v| <= 3.4e38 / (2 n)`` for a request of ``n`` keys (p * v is summed before normalising), else that row may
    come out inf or NaN (or zero with lse -inf when every score falls below -3.4e38). Validation asked for
    (``validate=True`` or ``SPLITLAB_VALIDATE=1``, not the default) reads the result back (a second sync, after the
    launch) and refuses such a row, where the inputs it attends are finite, in one line naming the bound. Inputs
    that require grad are refused while autograd records (no backward).
    """
    _check_inputs(q, k_cache, v_cache, block_table, seq_lens)
    B, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    max_pages = block_table.shape[1]
    scale = resolve_sm_scale(sm_scale, D)
    want = validate_setting(validate)

    def request(r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # validation's error path
        n = int(seq_lens[r])
        return (q[r].reshape(Hkv, Hq // Hkv, D), gather_keys(k_cache, block_table[r], n, page_size),
                gather_keys(v_cache, block_table[r], n, page_size))

    planned = _launch.planned_default() if num_splits is None and B else None
    if planned is not None:  # a cached plan, scheduled on the device: no sync (kernels.default_call)
        check_paged_launch(q, "gqa_decode", block_table, seq_lens, num_pages, page_size, planning=False, want=want)
        out, lse = planned.gqa(q, k_cache, v_cache, block_table, seq_lens, block_n=block_n, num_warps=num_warps,
                               num_stages=num_stages, sm_scale=sm_scale, return_lse=return_lse or want)
        if want:
            check_result("gqa_decode", out, lse, seq_lens > 0, request, scale)
        return (out, lse) if return_lse else out

    dtype = TORCH_DTYPE_NAMES[q.dtype]
    # With num_splits=None, the one host sync: every request's length for the planner, and the checks.
    lens = check_paged_launch(q, "gqa_decode", block_table, seq_lens, num_pages, page_size,
                              planning=num_splits is None, want=want)
    if num_splits is None:
        lens = planning_lengths(lens)
        device = resolve_device(like=q)
        w = DecodeWorkload(kind="gqa", batch=B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim_qk=D, head_dim_v=D,
                           ctx_len=max(lens), page_size=page_size, dtype=dtype, seq_lens=lens)
        facts = gqa_launch_facts(w, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                                 device=device)
    else:
        knobs = (num_splits, block_n, num_warps, num_stages)
        # The knob types are part of the key: True == 1, yet num_splits=True must be refused.
        key = (B, Hq, Hkv, D, page_size, dtype, *knobs, tuple(map(type, knobs)))
        try:
            facts = _fixed_split_facts(*key)
        except TypeError:  # an unhashable knob: let the uncached path name it
            facts = _fixed_split_facts.__wrapped__(*key)
    S = facts.num_splits
    group = Hq // Hkv
    block_d = max(16, next_power_of_two(D))

    lse = _launch.alloc(B, Hq, dtype=torch.float32, device=q.device)
    if S == 1:
        # The partial kernel writes the final result: split stride 0.
        out = _launch.alloc(B, Hq, D, dtype=q.dtype, device=q.device)
        dst, dst_lse = out, lse
        dst_strides = (out.stride(0), out.stride(1), 0, out.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1), 0)
    else:
        dst = _launch.alloc(B, Hq, S, D, dtype=torch.float32, device=q.device)
        check_spans(f"the partials of num_splits={S}", dst, (1, 2, 3))
        dst_lse = _launch.alloc(B, Hq, S, dtype=torch.float32, device=q.device)
        dst_strides = (dst.stride(0), dst.stride(1), dst.stride(2), dst.stride(3))
        lse_strides = tuple(dst_lse.stride())

    upcast = interpret_upcast(q.dtype)
    fp32_dot = upcast or q.dtype == torch.float32
    _gqa_partial_kernel[facts.grid](
        q, k_cache, v_cache, block_table, seq_lens, dst, dst_lse,
        scale * LOG2E,
        Hkv, group, S,
        seq_lens.stride(0), num_pages, max_pages * page_size,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(),
        *dst_strides, *lse_strides,
        PAGE_SIZE=page_size, HEAD_DIM=D, BLOCK_G=facts.block_h, BLOCK_N=facts.block_n, BLOCK_D=block_d,
        UPCAST=upcast, DOT_PRECISION="ieee" if fp32_dot else None,
        num_warps=facts.num_warps, num_stages=facts.num_stages,
    )
    if S > 1:
        out = _launch.alloc(B, Hq, D, dtype=q.dtype, device=q.device)
        launch_combine(dst, dst_lse, out, lse)
    if want:  # asked for: a row that overflowed fp32 where the reference is finite is refused (_launch.check_result)
        check_result("gqa_decode", out, lse, seq_lens > 0, request, scale)
    return (out, lse) if return_lse else out
