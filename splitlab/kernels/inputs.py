"""The inputs of splitlab's decode kernels: what the sweep harness, the bench, the tests and the GPU checks launch on.

Inputs are fresh random draws (never zeros), block tables are shuffled so that logical and physical pages differ
(``gqa_inputs``, ``mla_inputs``, ``sparse_mla_inputs``, and ``workload_inputs`` for a ``DecodeWorkload``); the
hostile inputs the tests use are built here too (NaN where nothing may be read: ``poison_unread_pages_``; strided
lengths: ``strided_lens``). How outputs are checked against the fp64 reference is ``splitlab.kernels.accuracy``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from splitlab.errors import SplitlabError
from splitlab.kernels._launch import FP8_KV_DTYPE, TORCH_DTYPE_NAMES
from splitlab.workloads import DecodeWorkload

DTYPES = {name: dtype for dtype, name in TORCH_DTYPE_NAMES.items()}  # "bf16" -> torch.bfloat16, ...


def query_dtype(name: str) -> torch.dtype:
    """The dtype of q (and of the output, and so of the tolerance) for a workload's cache dtype ``name``:
    itself, or bf16 beside an fp8 cache."""
    dtype = DTYPES[name]
    return torch.bfloat16 if dtype == FP8_KV_DTYPE else dtype


def quantize_fp8(kv: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """``kv / kv_scale`` as an fp8 e4m3 cache (the kernels' ``kv_scale`` dequantises it)."""
    return (kv.float() / kv_scale).to(FP8_KV_DTYPE)


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


@contextlib.contextmanager
def poisoned_allocs(made: list | None = None) -> Iterator[list]:
    """Within it, every floating buffer the launchers allocate (``_launch.alloc``) starts NaN, so an element a kernel
    never writes fails the check; each buffer is appended to ``made`` (returned), so a caller can check them all."""
    from splitlab.kernels import _launch

    made = [] if made is None else made
    real = _launch.alloc

    def alloc(*shape, dtype, device):
        t = real(*shape, dtype=dtype, device=device)
        made.append(poison_(t) if t.is_floating_point() else t)
        return t

    _launch.alloc = alloc
    try:
        yield made
    finally:
        _launch.alloc = real


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
