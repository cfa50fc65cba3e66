"""What the three launchers share: knob and tensor validation, and launch facts (grid, CTAs) that the
sweep harness can read without launching anything."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from splitlab.errors import SplitlabError, check_int
from splitlab.planners._math import cdiv

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The fp8 cache dtype the MLA kernels take beside 16-bit queries (dequantised in-kernel by ``kv_scale``).
FP8_KV_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class LaunchFacts:
    """One split-K decode call as launched: the partial kernel's grid and knobs, and the combine's grid
    (``None`` when ``num_splits == 1`` and the partial kernel writes the output itself)."""

    kernel: str
    grid: tuple[int, ...]
    num_splits: int
    num_warps: int
    num_stages: int
    block_n: int | None = None
    block_k: int | None = None
    block_h: int | None = None
    combine_grid: tuple[int, ...] | None = None

    @property
    def ctas(self) -> int:
        """CTAs of the partial launch."""
        n = 1
        for g in self.grid:
            n *= g
        return n


def check_pow2(name: str, value: object, *, lo: int = 1, hi: int = 1 << 16) -> int:
    """``value`` as an int that is a power of two in ``[lo, hi]``; a SplitlabError otherwise."""
    v = check_int(name, value)
    if v & (v - 1) or not lo <= v <= hi:
        raise SplitlabError(f"{name}={value!r} is not allowed; expected a power of two in [{lo}, {hi}]")
    return v


def check_knob(name: str, value: object, *, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]``."""
    v = check_int(name, value)
    if v < lo or (hi is not None and v > hi):
        raise SplitlabError(f"{name}={value!r} is not allowed; expected an integer in [{lo}, {hi or 'inf'}]")
    return v


def check_tensor(name: str, t: object, ndim: int, *, dtypes: tuple[torch.dtype, ...] | None = None,
                 device: torch.device | None = None) -> torch.Tensor:
    """``t`` is a tensor of ``ndim`` dims, of one of ``dtypes``, on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise SplitlabError(f"{name} is a {type(t).__name__}; expected a torch.Tensor")
    if t.dim() != ndim:
        raise SplitlabError(f"{name} has shape {tuple(t.shape)}; expected {ndim} dimensions")
    if dtypes is not None and t.dtype not in dtypes:
        raise SplitlabError(f"{name} has dtype {t.dtype}; expected one of {', '.join(map(str, dtypes))}")
    if device is not None and t.device != device:
        raise SplitlabError(f"{name} is on {t.device}; expected {device} like q")
    return t


def check_kv_dtype(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: float | None) -> float:
    """The latent cache has q's dtype, or is fp8 e4m3 beside a 16-bit q (``FP8_KV_DTYPE``); returns the
    dequantisation scale: ``kv_scale`` (a positive finite float, 1.0 when None) for an fp8 cache, 1.0
    otherwise, where passing ``kv_scale`` is refused (it would be silently ignored)."""
    if kv_cache.dtype != FP8_KV_DTYPE:
        check_same_dtype(q, kv_cache=kv_cache)
        if kv_scale is not None:
            raise SplitlabError(f"kv_scale={kv_scale!r} is not allowed for a {kv_cache.dtype} cache; expected "
                                f"None (kv_scale dequantises an {FP8_KV_DTYPE} cache)")
        return 1.0
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise SplitlabError(f"q has dtype {q.dtype}; expected torch.bfloat16 or torch.float16 beside an "
                            f"{FP8_KV_DTYPE} kv_cache")
    if kv_scale is None:
        return 1.0
    v = float(kv_scale)
    if not (v > 0 and v != float("inf")):
        raise SplitlabError(f"kv_scale={kv_scale!r} is not allowed; expected a positive finite float")
    return v


def check_same_dtype(q: torch.Tensor, **others: torch.Tensor) -> None:
    """Every cache has q's dtype."""
    for name, t in others.items():
        if t.dtype != q.dtype:
            raise SplitlabError(f"{name} has dtype {t.dtype}; expected q's dtype {q.dtype}")


def resolve_sm_scale(sm_scale: float | None, head_dim_qk: int) -> float:
    """``1/sqrt(Dqk)`` by default; a positive finite float otherwise."""
    if sm_scale is None:
        return head_dim_qk ** -0.5
    s = float(sm_scale)
    if not (s > 0 and s != float("inf")):
        raise SplitlabError(f"sm_scale={sm_scale!r} is not allowed; expected a positive finite float")
    return s


def split_len(max_keys: int, num_splits: int, block: int) -> int:
    """Keys per split, rounded up to whole tiles so that splits start on tile boundaries."""
    return cdiv(cdiv(max(max_keys, 1), num_splits), block) * block


# --- shared launcher helpers (appended for the MLA / sparse-MLA launchers; usable by any launcher) ----------

TORCH_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                     FP8_KV_DTYPE: "fp8_e4m3"}


#: Triton picks the interpreter when ``@triton.jit`` runs, at the kernel modules' import (which imports this
#: module first), so the flag is read once, then too.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def interpret_upcast(dtype: torch.dtype) -> bool:
    """True when kernels run under Triton's interpreter (``TRITON_INTERPRET=1``) and ``dtype`` is bf16:
    the interpreter's bf16 arithmetic and bf16 ``tl.dot`` are wrong, so tiles are upcast to fp32 right
    after ``tl.load``. Never true on a GPU."""
    return INTERPRET and dtype == torch.bfloat16


def dot_input_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: ``"ieee"`` for fp32 inputs (no tf32 rounding), ``"tf32"`` (Triton's
    default, ignored for 16-bit operands) otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def resolve_device(device: object = None, *, cuda: bool | None = None, like: torch.Tensor | None = None):
    """The ``DeviceSpec`` a launcher plans for: ``device`` as given (a ``DeviceSpec`` or preset name);
    else the GPU ``like`` lives on, or the GPU torch sees when ``cuda`` (default:
    ``torch.cuda.is_available()``); else the ``h200`` preset, so that ``num_splits=None`` works under the
    CPU interpreter."""
    from splitlab.devices import DeviceSpec, detect
    from splitlab.devices import get as get_device

    if isinstance(device, DeviceSpec):
        return device
    if device is not None:
        return get_device(str(device))
    if like is not None:
        return detect(like.device.index) if like.is_cuda else get_device("h200")
    if cuda is None:
        cuda = torch.cuda.is_available()
    return detect() if cuda else get_device("h200")


def device_guard(t: torch.Tensor):
    """A context that makes ``t``'s GPU current for a launch (a no-op on the CPU)."""
    import contextlib

    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def capturing(t: torch.Tensor) -> bool:
    """True while ``t``'s stream is being captured into a CUDA graph, where no host sync may happen."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def no_sync_under_capture(t: torch.Tensor, what: str) -> None:
    """Refuse, with a clear message, a launcher path that must read a device value during graph capture."""
    if capturing(t):
        raise SplitlabError(f"{what} reads a device value (one host sync), which CUDA graph capture forbids; "
                            "pass num_splits (and the tiles) explicitly when capturing")


def alloc(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launchers allocate (partials, lse, the output) comes from here: one seam, so the
    tests can poison with NaN everything a kernel must overwrite. Callers look it up through the module
    (``_launch.alloc``) so that a patch reaches them."""
    return torch.empty(*shape, dtype=dtype, device=device)
