"""PyTorch's own decode paths, timed beside splitlab's kernels: SDPA (flash, cuDNN) and FlexAttention; and the
checks the library peers share (``peers_flashinfer``, ``peers_flashmla``).

They take contiguous KV ``[B, Hkv, N, D]`` (their natural decode layout; splitlab's kernels read a paged
cache) with one query token per request and uniform lengths. Each returns a zero-argument callable that
runs one decode, or raises ``RuntimeError`` with the reason when the backend refuses the shape. ``SDPA_FLASH``,
``SDPA_CUDNN`` and ``FLEX`` are the same paths as sweep implementations (kernel cards of type "external").
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

_FLEX_CACHE: dict = {}


def library_missing(module: str, what: str, install: str) -> str | None:
    """One line saying that ``what`` needs the Python package ``module`` and how to get it, or None when it is
    importable (found, not imported: the peers import their library only where a point runs)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{what} is not installed here (no module {module!r}); {install}"


def gpu_missing(label: str, *, arch: tuple[int, int] | None = None) -> str | None:
    """One line saying why ``label`` cannot run on this machine's GPU (none, or, with ``arch``, older than that
    compute capability), or None."""
    if not torch.cuda.is_available():
        return f"{label}: needs a CUDA GPU; torch sees none"
    if arch is not None and torch.cuda.get_device_capability() < arch:
        have = ".".join(map(str, torch.cuda.get_device_capability()))
        return f"{label}: needs compute capability {arch[0]}.{arch[1]} or newer; this GPU has {have}"
    return None


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


# --- the peers as sweep implementations (kernel cards of type "external") ---------------------------------

class PeerImpl:
    """One of PyTorch's decode paths as a sweep implementation (``splitlab.bench.impls.Impl``): no knobs (each
    picks its own split count), contiguous KV, uniform lengths, GQA/MHA/MQA workloads. Checked against
    ``splitlab.kernels.reference.gqa_decode`` on the same tensors (the contiguous cache viewed as one page
    per request). Unavailable without a CUDA GPU."""

    knobs: tuple[str, ...] = ()
    kinds = ("gqa",)

    def __init__(self, backend: str) -> None:
        if backend not in ("flash", "cudnn", "flex"):
            raise ValueError(f"backend={backend!r} is not allowed; expected flash, cudnn or flex")
        self.backend = backend

    def unavailable(self) -> str | None:
        if not torch.cuda.is_available():
            return f"{self.backend}: PyTorch's decode path needs a CUDA GPU; torch sees none"
        return None

    def launch_facts(self, w, knobs, device) -> None:
        return None

    def inputs(self, w, *, device, seed: int) -> dict:
        if w.kind != "gqa" or w.seq_lens is not None or w.ragged:  # contiguous K/V of one length per request
            raise ValueError(f"kind={w.kind!r} with ragged lengths is not allowed; expected a uniform gqa workload")
        from splitlab.kernels.inputs import DTYPES

        dtype = DTYPES[w.dtype]
        q, k, v = contiguous_kv(w.batch, w.num_q_heads, w.num_kv_heads, w.head_dim_qk, w.ctx_len, w.head_dim_v,
                                dtype=dtype, seed=seed)
        return dict(q=q, k=k, v=v)

    def reference(self, w, inputs: dict) -> torch.Tensor:
        from splitlab.kernels import reference

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        batch, _, n, _ = k.shape
        table = torch.arange(batch, dtype=torch.int32, device=k.device).view(batch, 1)
        lens = torch.full((batch,), n, dtype=torch.int32, device=k.device)
        return reference.gqa_decode(q[:, :, 0], k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), table, lens)

    def call(self, w, inputs: dict, knobs: dict) -> Callable[[], torch.Tensor]:
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        run = flex(q, k, v) if self.backend == "flex" else sdpa(self.backend, q, k, v)

        def decode() -> torch.Tensor:
            return run()[:, :, 0]

        return decode


SDPA_FLASH = PeerImpl("flash")
SDPA_CUDNN = PeerImpl("cudnn")
FLEX = PeerImpl("flex")
