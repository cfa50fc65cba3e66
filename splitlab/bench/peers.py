"""PyTorch's own decode paths, timed beside splitlab's kernels: SDPA (flash, cuDNN) and FlexAttention.

They take contiguous KV ``[B, Hkv, N, D]`` (their natural decode layout; splitlab's kernels read a paged
cache) with one query token per request and uniform lengths. Each returns a zero-argument callable that
runs one decode, or raises ``RuntimeError`` with the reason when the backend refuses the shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_FLEX_CACHE: dict = {}


def contiguous_kv(batch: int, num_q_heads: int, num_kv_heads: int, d: int, n: int, dv: int | None = None,
                  *, dtype=torch.bfloat16, seed: int = 0):
    """q [B, Hq, 1, D], k [B, Hkv, N, D], v [B, Hkv, N, Dv] on the GPU, random."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dv = dv or d
    q = torch.randn(batch, num_q_heads, 1, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(batch, num_kv_heads, n, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, num_kv_heads, n, dv, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def sdpa(backend: str, q, k, v) -> Callable[[], torch.Tensor]:
    """SDPA pinned to one backend (``flash`` or ``cudnn``); raises if the backend refuses the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa_fn

    b = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel([b]):
            return sdpa_fn(q, k, v, enable_gqa=gqa)

    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:  # the backend refused the shape: report why, never time a fallback
        raise RuntimeError(f"sdpa-{backend}: {str(e).splitlines()[0][:160]}") from None
    return run


def flex(q, k, v) -> Callable[[], torch.Tensor]:
    """``torch.compile(flex_attention)`` (its decode path picks its own split count), compiled per shape."""
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _FLEX_CACHE:
        torch._dynamo.config.cache_size_limit = 1024
        _FLEX_CACHE["fn"] = torch.compile(flex_attention, dynamic=False)
    fn = _FLEX_CACHE["fn"]
    gqa = q.shape[1] != k.shape[1]

    def run():
        return fn(q, k, v, enable_gqa=gqa)

    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:
        raise RuntimeError(f"flex: {str(e).splitlines()[0][:160]}") from None
    return run
