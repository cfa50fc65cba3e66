"""fp64 torch references for splitlab's decode kernels: the yardstick every kernel is checked against.

Each function has the same signature as the Triton launcher it checks; tuning knobs (``num_splits``,
``block_n``, ...) are accepted and ignored, so a test can call both with one set of arguments. Results
are float64. A request with no keys gives an all-zero row and ``lse = -inf``.
"""

from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [H, Dqk], k [N, Dqk], v [N, Dv] (float64) -> out [H, Dv], lse [H] (natural log)."""
    if k.shape[0] == 0:
        return (torch.zeros(q.shape[0], v.shape[-1], dtype=torch.float64, device=q.device),
                torch.full((q.shape[0],), NEG_INF, dtype=torch.float64, device=q.device))
    s = (q @ k.T) * sm_scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[:, None]) @ v, lse


def _gather_pages(cache: torch.Tensor, block_table_row: torch.Tensor, n: int, page_size: int) -> torch.Tensor:
    """The first ``n`` tokens of one request from a paged cache ``[num_pages, page_size, ...]``."""
    pages = block_table_row[: -(-n // page_size)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def _finish(out: torch.Tensor, lse: torch.Tensor, return_lse: bool):
    return (out, lse) if return_lse else out


def gqa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, *, sm_scale: float | None = None, return_lse: bool = False,
               **knobs: object):
    """Paged GQA/MHA/MQA decode. q [B, Hq, D]; caches [num_pages, page_size, Hkv, D]; out [B, Hq, Dv]."""
    B, Hq, D = q.shape
    page_size, Hkv, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    out = torch.empty(B, Hq, Dv, dtype=torch.float64, device=q.device)
    lse = torch.empty(B, Hq, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        k = _gather_pages(k_cache, block_table[b], n, page_size).double()  # [n, Hkv, D]
        v = _gather_pages(v_cache, block_table[b], n, page_size).double()
        for h in range(Hkv):
            rows = slice(h * group, (h + 1) * group)
            out[b, rows], lse[b, rows] = _attend(q[b, rows].double(), k[:, h], v[:, h], scale)
    return _finish(out, lse, return_lse)


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               *, head_dim_v: int = 512, sm_scale: float | None = None, kv_scale: float | None = None,
               return_lse: bool = False, **knobs: object):
    """Absorbed MLA decode over a latent cache [num_pages, page_size, Dqk]; K = all Dqk columns,
    V = the first ``head_dim_v``. q [B, H, Dqk]; out [B, H, head_dim_v]. The cache's values times
    ``kv_scale`` (an fp8 cache's dequantisation scale; 1 when None) are the keys."""
    B, H, Dqk = q.shape
    page_size = kv_cache.shape[1]
    scale = 1.0 / math.sqrt(Dqk) if sm_scale is None else sm_scale
    out = torch.empty(B, H, head_dim_v, dtype=torch.float64, device=q.device)
    lse = torch.empty(B, H, dtype=torch.float64, device=q.device)
    for b in range(B):
        kv = _gather_pages(kv_cache, block_table[b], int(seq_lens[b]), page_size).double() * (kv_scale or 1.0)
        out[b], lse[b] = _attend(q[b].double(), kv, kv[:, :head_dim_v], scale)
    return _finish(out, lse, return_lse)


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *, head_dim_v: int = 512,
                      sm_scale: float | None = None, kv_scale: float | None = None, return_lse: bool = False,
                      **knobs: object):
    """Sparse top-k MLA decode: q [T, H, Dqk] attends to ``kv_cache[indices[t]]`` ([num_slots, Dqk]) times
    ``kv_scale`` (1 when None); ``-1`` marks an invalid slot (skipped). out [T, H, head_dim_v]."""
    T, H, Dqk = q.shape
    scale = 1.0 / math.sqrt(Dqk) if sm_scale is None else sm_scale
    out = torch.empty(T, H, head_dim_v, dtype=torch.float64, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float64, device=q.device)
    for t in range(T):
        idx = indices[t][indices[t] >= 0].long()
        kv = kv_cache[idx].double() * (kv_scale or 1.0)
        out[t], lse[t] = _attend(q[t].double(), kv, kv[:, :head_dim_v], scale)
    return _finish(out, lse, return_lse)


def combine(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split partials by log-sum-exp. partial_out [rows, heads, S, Dv] (each split normalised by
    its own sum), partial_lse [rows, heads, S] (-inf for a split with no keys) -> (out, lse). An empty split
    (-inf) contributes nothing, its row unread; a NaN lse makes the whole (row, head) NaN."""
    po, pl = partial_out.double(), partial_lse.double()
    lse = torch.logsumexp(pl, dim=-1)  # -inf where every split is empty; NaN with a NaN lse
    w = torch.exp(pl - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])  # 0 for empty splits
    out = (w[..., None] * torch.where(torch.isneginf(pl)[..., None], 0.0, po)).sum(dim=-2)
    return out, lse
