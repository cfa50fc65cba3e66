"""What the three launchers share: knob and tensor validation, and launch facts (grid, CTAs) that the
sweep harness can read without launching anything.

Tensor arguments. Every launcher checks each tensor's dims, dtype and device (``check_tensor``; a launch runs on
a GPU, or on the CPU under ``TRITON_INTERPRET=1``: ``check_launch_device``), passes every stride to its kernel
(any layout is honoured), and refuses a dimension the kernels index in 32-bit arithmetic whose span reaches 2^31
elements (``check_spans``). An ``out`` / ``lse`` buffer given to ``combine`` must have the exact shape, a float
dtype (fp32 for lse), q's device and strides whose elements do not overlap (``check_out``).

Validation of values (the switch). What a kernel reads *through* a value -- the pages a block table names, the
lengths that say how many of them, the slots sparse MLA's indices name -- can only be checked by reading the
values on the host (one device-to-host sync, which CUDA graph capture forbids). ``validate_setting`` resolves the
one switch every launcher takes:

* the launcher argument ``validate``: True (check), False (do not), None (default: the environment's setting);
* else the environment variable ``SPLITLAB_VALIDATE`` (``VALIDATE_ENV``): ``1`` check, ``0`` do not;
* else the launcher's default: ON where the launcher synchronises anyway (``num_splits=None``, whose planner reads
  ``seq_lens``; sparse MLA, which has always checked its indices, except under graph capture), OFF on the paged
  launchers' explicit-``num_splits`` path, which stays free of host syncs.

What is checked (``check_paged_values``, ``check_indices``): ``0 <= seq_lens <= max_pages * page_size``; every
block-table entry a request reads (its first ``cdiv(seq_len, page_size)`` columns; the rest are never read and may
hold anything) in ``[0, num_pages)``; sparse indices in ``[-1, num_slots)``. Asking for validation under graph
capture is refused (``SplitlabError``).

Without validation the kernels still never read outside the cache, the pool or the block table: a length outside
``[0, max_pages * page_size]`` makes its request's output NaN (every kernel); a block-table entry or an index out of
range is not dereferenced and makes its request's output NaN on the Triton kernels, and leaves it *undefined* on
the sm_90 Gluon tile (``mla_sm90``, paged MLA; its sparse path gives NaN). No launcher returns a finite number for
such input when validation is on.

Scalars, gradients and fp32 range. ``sm_scale`` and ``kv_scale`` are real numbers (Python or numpy
scalars; a bool, complex, string, array or tensor is refused), and the kernels take ``sm_scale * log2(e)`` (times
``kv_scale`` for an fp8 MLA cache) as one fp32 argument: ``resolve_sm_scale`` refuses, on the host, a product
outside fp32's normal range ``[FP32_TINY, FP32_MAX]`` (``sm_scale`` in ``[SM_SCALE_MIN, SM_SCALE_MAX]``, about
``[8.1e-39, 2.4e38]``, when ``kv_scale`` is 1) and a ``kv_scale`` outside it. The kernels have no backward:
``check_no_grad`` refuses an input that requires grad while autograd is recording (under ``torch.no_grad()`` or
``torch.inference_mode()`` such a tensor is read like any other).

What the data must satisfy, since the kernels compute in fp32 (the reference in fp64): every score ``sm_scale *
q.k`` (and the dot's partial sums, at most ``sum |q * k|``) within fp32's range, and ``|v| * n`` below
``FP32_MAX`` for the ``n`` keys a request attends (each split sums ``p * v`` with weights ``p <= 1`` before it
normalises, and the merge sums up to ``n`` live splits likewise), the result within q's dtype. Outside that a
request's row comes out inf or NaN (or, when every score of a request falls below ``-FP32_MAX``, all zero with
lse -inf), where the fp64 reference is finite. Reading the data to check this beforehand would cost a pass over
the cache, so validation checks the *result*: with validation asked for (``validate=True`` or
``SPLITLAB_VALIDATE=1``, not the launchers' defaults) a launcher reads back whether any row of its result is
non-finite (one more sync, after the launch) and, where a row is though the inputs it attends are finite, refuses
with the bound it crossed (``check_result``). A NaN or inf among the inputs stays what it is (the reference's).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from splitlab.errors import SplitlabError, check_int
from splitlab.intmath import cdiv

if TYPE_CHECKING:
    from splitlab.planners.registry import Plan
    from splitlab.workloads import DecodeWorkload

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


#: Dimensions the kernels index in 32-bit arithmetic (head, column, slot in a page, ...) must span fewer elements.
INT32_SPAN = 1 << 31


def check_spans(name: str, t: torch.Tensor, dims: tuple[int, ...]) -> None:
    """Refuse a layout the kernels would address wrongly: along each of ``dims`` (indexed in 32-bit arithmetic in
    the kernels) ``(size - 1) * stride`` must stay below 2^31 elements."""
    shape, strides = t.shape, t.stride()
    for d in dims:
        span = (shape[d] - 1) * strides[d]
        if span >= INT32_SPAN:
            raise SplitlabError(f"{name} has shape {tuple(t.shape)} and strides {tuple(t.stride())}: dimension {d} "
                                f"spans {span} elements; expected fewer than 2^31 (the kernels index it in 32 bits)")


def overlapping(t: torch.Tensor) -> bool:
    """True unless ``t``'s elements are provably distinct memory: with the dimensions of size > 1 sorted by
    stride, each stride exceeds the span of the ones before it (a zero stride, as ``expand`` makes, fails; so do
    rare interleaved layouts whose elements happen to be distinct)."""
    reach = 0
    dims = [(size, stride) for size, stride in zip(t.shape, t.stride(), strict=True) if size > 1]
    for size, stride in sorted(dims, key=lambda d: d[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def check_out(name: str, t: object, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
              device: torch.device) -> torch.Tensor:
    """An output buffer: a tensor of exactly ``shape``, one of ``dtypes``, on ``device``, whose elements do not
    overlap (any other strides are honoured)."""
    check_tensor(name, t, len(shape), dtypes=dtypes, device=device)
    if tuple(t.shape) != tuple(shape):
        raise SplitlabError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)}")
    if overlapping(t):
        raise SplitlabError(f"{name} has strides {tuple(t.stride())} whose elements may overlap (shape "
                            f"{tuple(t.shape)}); expected non-overlapping strides (e.g. a contiguous tensor or a "
                            "permutation of one)")
    return t


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the byte ranges ``a`` and ``b`` span intersect (a conservative test of aliasing)."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        if t.numel() == 0:
            return 0, 0
        last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_launch_device(name: str, t: torch.Tensor) -> None:
    """A kernel launches on a CUDA GPU, or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1`` set
    before import); looked up through the module (``_launch.check_launch_device``), a seam for the compile test."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and INTERPRET):
        return
    if t.device.type == "cpu":
        raise SplitlabError(f"{name} is on the CPU; expected a GPU tensor (or TRITON_INTERPRET=1 set before import)")
    raise SplitlabError(f"{name} is on {t.device}; expected a CUDA tensor")


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
    v = check_real("kv_scale", kv_scale)
    if not FP32_TINY <= v <= FP32_MAX:  # (NaN fails too) the kernels take it as an fp32 (the epilogue's v_scale)
        raise SplitlabError(f"kv_scale={short_repr(kv_scale)} is not allowed; expected a positive real number in "
                            f"fp32's normal range [{FP32_TINY!r}, {FP32_MAX!r}] (the kernels take it as an fp32)")
    return v


def check_same_dtype(q: torch.Tensor, **others: torch.Tensor) -> None:
    """Every cache has q's dtype."""
    for name, t in others.items():
        if t.dtype != q.dtype:
            raise SplitlabError(f"{name} has dtype {t.dtype}; expected q's dtype {q.dtype}")


#: log2(e): the launchers hand the kernels ``sm_scale * LOG2E`` (scores in the log2 domain, for exp2); equal to
#: ``gqa.LOG2E`` and ``mla.LOG2E``.
LOG2E = 1.4426950408889634
#: fp32's largest finite value and its smallest normal one: the kernels take their scales as fp32 arguments.
FP32_MAX = float(torch.finfo(torch.float32).max)
FP32_TINY = float(torch.finfo(torch.float32).tiny)


def _scale_edges() -> tuple[float, float]:
    """The smallest and the largest double ``s`` whose product ``s * LOG2E`` (as the launchers compute it, in
    double) lies in ``[FP32_TINY, FP32_MAX]``."""
    lo, hi = FP32_TINY / LOG2E, FP32_MAX / LOG2E
    while lo * LOG2E < FP32_TINY:
        lo = math.nextafter(lo, math.inf)
    while math.nextafter(lo, 0.0) * LOG2E >= FP32_TINY:
        lo = math.nextafter(lo, 0.0)
    while hi * LOG2E > FP32_MAX:
        hi = math.nextafter(hi, 0.0)
    while math.nextafter(hi, math.inf) * LOG2E <= FP32_MAX:
        hi = math.nextafter(hi, math.inf)
    return lo, hi


#: The ``sm_scale`` range the launchers take (with ``kv_scale`` 1): about [8.148e-39, 2.359e+38].
SM_SCALE_MIN, SM_SCALE_MAX = _scale_edges()


def short_repr(value: object, limit: int = 40) -> str:
    """``repr(value)`` on one line (whitespace runs as one space), cut to ``limit`` characters (a 400-digit int,
    a tensor, stay one short line)."""
    r = " ".join(repr(value).split())
    return r if len(r) <= limit else f"{r[:limit - 3]}..."


def check_real(name: str, value: object) -> float:
    """``value`` as a Python float if it is a real number: an int, a float or a numpy scalar (``numbers.Real``);
    a bool, a complex, a string, an array or a tensor (reading a GPU one is a host sync) is refused. An int too
    large for a double becomes inf (which a range check then refuses)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SplitlabError(f"{name}={short_repr(value)} is not allowed; expected a real number (a Python or numpy "
                            "scalar; not a bool, a complex, a string, an array or a tensor: pass float(t))")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def resolve_sm_scale(sm_scale: object, head_dim_qk: int, *, kv_scale: float = 1.0) -> float:
    """``1/sqrt(Dqk)`` by default; else ``sm_scale`` (``check_real``) as a float. The kernels take
    ``sm_scale * kv_scale * LOG2E`` (computed so, in double) as one fp32 argument, so that product must lie in fp32's
    normal range ``[FP32_TINY, FP32_MAX]``: past FP32_MAX it would be inf (every score inf or NaN), below
    FP32_TINY a subnormal or 0 (which the interpreter types as fp64 and a GPU may flush: MLA's isolated-QK tile
    then skips every key). With ``kv_scale`` 1 that is ``sm_scale`` in ``[SM_SCALE_MIN, SM_SCALE_MAX]``. A check of
    the host value: no sync. Whether the scores ``sm_scale * q.k`` stay within fp32 is a question of the data
    (``check_result``, with validation asked for)."""
    s = head_dim_qk ** -0.5 if sm_scale is None else check_real("sm_scale", sm_scale)
    qk = s * kv_scale * LOG2E
    if not FP32_TINY <= qk <= FP32_MAX:  # NaN fails too
        if kv_scale == 1.0:
            raise SplitlabError(f"sm_scale={short_repr(sm_scale)} is not allowed; expected a real number in "
                                f"[{SM_SCALE_MIN!r}, {SM_SCALE_MAX!r}] (the kernels take sm_scale * log2(e) as one "
                                "fp32, which must be normal and finite)")
        raise SplitlabError(f"sm_scale={short_repr(sm_scale)} is not allowed with kv_scale={kv_scale!r}; expected "
                            f"sm_scale * kv_scale * log2(e) (here {qk:.4g}) in fp32's normal range "
                            f"[{FP32_TINY!r}, {FP32_MAX!r}] (the kernels take it as one fp32)")
    return s


def check_no_grad(**tensors: torch.Tensor | None) -> None:
    """Refuse a tensor that requires grad while autograd records (``torch.is_grad_enabled()``): the kernels have
    no backward, so the output would silently carry no gradient. Under ``torch.no_grad()`` or
    ``torch.inference_mode()`` such tensors are read like any other."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise SplitlabError(f"{name} requires grad; expected a tensor that does not, as the splitlab kernels "
                                f"have no backward: pass {name}.detach(), or call under torch.no_grad() or "
                                "torch.inference_mode()")


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


def launch_plan(w: DecodeWorkload, device: object = None) -> Plan:
    """The default planner's ``Plan`` for workload ``w`` on ``device`` (``resolve_device``): what a launcher's
    ``num_splits=None`` launches (its split count, and any tile the plan names that the caller did not give)."""
    from splitlab.planners import default_plan  # lazy: the planner package imports every port

    return default_plan(w, resolve_device(device))


_NO_GUARD = contextlib.nullcontext()


def device_guard(where: torch.Tensor | torch.device):
    """A context that makes the GPU of ``where`` (a tensor, or a device) current for a launch: none where it is
    current already (torch's guard costs microseconds of host time a call: ``experiments/plan_run/launch_probe.py``'s
    ``guard``) or on the CPU."""
    dev = where.device if isinstance(where, torch.Tensor) else where
    if dev.type != "cuda" or dev.index is None or torch.cuda.current_device() == dev.index:
        return _NO_GUARD
    return torch.cuda.device(dev.index)


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


# --- validation of the values a kernel reads through (the switch; see the module docstring) ----------------

#: The environment switch: ``1`` validates, ``0`` does not, unset (or empty) leaves each launcher its default.
VALIDATE_ENV = "SPLITLAB_VALIDATE"

#: ``kernels.default_call`` (the default call through a cached plan), installed there when the package imports it:
#: it sits above the launchers (its plans run kernels that import theirs), so they reach it through here.
_planned_default = None


def planned_default():
    """``kernels.default_call`` where its switch is on (``default_call.via_plan``), else None: what the launchers'
    ``num_splits=None`` asks before its own path."""
    m = _planned_default
    return m if m is not None and m.via_plan() else None


def validate_setting(validate: object) -> bool | None:
    """The validation asked for: the ``validate`` argument when not None, else ``SPLITLAB_VALIDATE`` (``1`` /
    ``0``), else None (the launcher's default)."""
    if validate is not None:
        if not isinstance(validate, bool):
            raise SplitlabError(f"validate={validate!r} is not allowed; expected True, False or None "
                                f"(None: {VALIDATE_ENV}, else the launcher's default)")
        return validate
    env = os.environ.get(VALIDATE_ENV, "")
    if env == "":
        return None
    if env not in ("0", "1"):
        raise SplitlabError(f"{VALIDATE_ENV}={env!r} is not allowed; expected 1 (validate), 0 (do not) or unset "
                            "(each launcher's default)")
    return env == "1"


def no_validation_under_capture(t: torch.Tensor, what: str) -> None:
    """Refuse validation asked for (argument or environment) while ``t``'s stream is captured into a graph."""
    if capturing(t):
        raise SplitlabError(f"validate=True (or {VALIDATE_ENV}=1) is not allowed while capturing a CUDA graph: "
                            f"{what} would read device values on the host; pass validate=False when capturing")


def check_paged_values(block_table: torch.Tensor, seq_lens: torch.Tensor, num_pages: int, page_size: int, *,
                       table: bool = True, lengths: bool = False) -> tuple[int, int, tuple[int, ...] | None]:
    """``(min, max, lens)`` of ``seq_lens`` (B >= 1), read in one host sync, after refusing lengths outside
    ``[0, max_pages * page_size]`` and, with ``table``, a block-table entry that a request reads (its first
    ``cdiv(seq_len, page_size)`` columns) outside ``[0, num_pages)``. ``lens``: with ``lengths``, every request's
    length as a tuple of ints, read in the same transfer (B more int32s, no second sync); None otherwise. About ten
    small device ops and one sync."""
    max_pages = block_table.shape[1]
    cap = max_pages * page_size
    stats = list(torch.aminmax(seq_lens))  # int32, like the count below: one stack, no casts
    if table and max_pages > 0:
        starts = torch.arange(0, cap, page_size, dtype=torch.int64, device=seq_lens.device)  # first key of a page
        read = starts[None, :] < seq_lens[:, None]  # [B, max_pages]: entries the request reads
        bad = read & (block_table.clamp(0, max(num_pages - 1, 0)) != block_table) if num_pages > 0 else read
        stats.append(bad.sum(dtype=torch.int32))
    packed = torch.stack(stats)
    if lengths:
        packed = torch.cat((packed, seq_lens))  # the lengths ride along (seq_lens is int32, any stride)
    vals = packed.tolist()  # the one host sync
    lo_v, hi_v = vals[0], vals[1]
    if lo_v < 0 or hi_v > cap:
        raise SplitlabError(f"seq_lens has values in [{lo_v}, {hi_v}]; expected [0, max_pages * page_size = {cap}] "
                            f"(block_table has {max_pages} columns of {page_size}-key pages)")
    if len(stats) > 2 and vals[2]:
        b, p = (int(i) for i in bad.nonzero()[0].tolist())  # the error path: a second sync is fine
        v, n = int(block_table[b, p]), int(seq_lens[b])
        raise SplitlabError(f"block_table[{b}, {p}] = {v} is outside [0, num_pages = {num_pages}) and request {b} "
                            f"reads it (seq_lens[{b}] = {n}, {page_size} keys a page; {vals[2]} read entries out of "
                            "range in all)")
    return lo_v, hi_v, tuple(vals[len(stats):]) if lengths else None


def planning_lengths(lens: tuple[int, ...]) -> tuple[int, ...]:
    """The per-request lengths a launcher gives the planner (``DecodeWorkload.seq_lens``): ``lens`` as they are
    (a request of 0 keys is one the kernels run, and ``DecodeWorkload`` takes it), except a batch whose every
    request is empty, which no workload describes (``ctx_len >= 1``): it is planned as requests of 1 key (the
    kernels still run one masked key tile in every split). Planning only: the kernels read ``seq_lens`` itself."""
    return lens if max(lens) > 0 else (1,) * len(lens)


def check_indices(indices: torch.Tensor, num_slots: int) -> None:
    """Refuse a sparse index outside ``[-1, num_slots)`` (-1: no key); one host sync."""
    lo, hi = torch.stack(torch.aminmax(indices)).tolist()
    if lo < -1 or hi >= num_slots:
        raise SplitlabError(f"indices has values in [{lo}, {hi}]; expected values in [-1, num_slots) = "
                            f"[-1, {num_slots}) (-1 = invalid)")


def check_paged_launch(q: torch.Tensor, what: str, block_table: torch.Tensor, seq_lens: torch.Tensor,
                       num_pages: int, page_size: int, *, planning: bool, want: bool | None
                       ) -> tuple[int, ...] | None:
    """The paged launchers' value checks (``want``: ``validate_setting``'s answer). ``planning``
    (``num_splits=None``): the one host sync, which checks the lengths always and the block table unless
    validation is off, and returns every request's length (a tuple of ints, read in that sync) for the planner
    (``planning_lengths``). Otherwise (no sync unless asked) the lengths and table are checked only when validation
    is on; returns None."""
    if planning:
        no_sync_under_capture(q, f"{what}(num_splits=None)")
        return check_paged_values(block_table, seq_lens, num_pages, page_size, table=want is not False,
                                  lengths=True)[2]
    if want:
        no_validation_under_capture(q, what)
        check_paged_values(block_table, seq_lens, num_pages, page_size)
    return None


# --- validation of the result: fp32 overflow where the fp64 reference is finite (the module docstring) ---------


def gather_keys(cache: torch.Tensor, table_row: torch.Tensor, n: int, page_size: int) -> torch.Tensor:
    """The first ``n`` keys' rows of one request from a paged cache ``[num_pages, page_size, ...]``."""
    return cache[table_row[:cdiv(n, page_size)].long()].reshape(-1, *cache.shape[2:])[:n]


def check_result(what: str, out: torch.Tensor, lse: torch.Tensor, has_keys: torch.Tensor,
                 request: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]], sm_scale: float, *,
                 kv_scale: float = 1.0, names: tuple[str, str] = ("k_cache", "v_cache")) -> None:
    """Validation's look at a launch's result, made only when validation is asked for (``validate=True`` or
    ``SPLITLAB_VALIDATE=1``): one host sync after the launch, on ``out [R, H, Dv]`` and ``lse [R, H]``.

    A row of ``out`` with an inf or NaN, or a non-finite lse where request ``r`` has keys (``has_keys [R]``; an
    empty request's lse is -inf), stands where an input that row attends holds NaN or inf (the fp64 reference's row
    is not finite either). Anywhere else the reference is finite and the fp32 kernels overflowed: refused, naming
    the bound crossed (scores, then V, see the module docstring). ``request(r)``: request r's inputs as the
    kernels read them, ``q [Hkv, G, Dqk]``, ``k [n, Hkv, Dqk]``, ``v [n, Hkv, Dv]`` (K and V times ``kv_scale``,
    dequantised); ``names``: the arguments holding K and V."""
    bad_rows = ~torch.isfinite(out).all(dim=-1) | (~torch.isfinite(lse) & has_keys[:, None])
    if not bool(bad_rows.any()):  # the sync
        return
    k_name, v_name = names
    for r in bad_rows.any(dim=1).nonzero().flatten().tolist():  # the error path: syncs are fine here
        q, k, v = (t.double().cpu() for t in request(r))
        hkv, group, _ = q.shape
        n = k.shape[0]
        kv_finite = torch.isfinite(k).flatten(2).all(-1).all(0) & torch.isfinite(v).flatten(2).all(-1).all(0)
        finite = torch.isfinite(q).all(-1) & kv_finite[:, None]  # [Hkv, G]: every input the row attends
        wrong = (bad_rows[r].cpu().view(hkv, group) & finite).flatten().nonzero().flatten().tolist()
        if not wrong:
            continue  # a NaN or inf input: the reference's row is not finite either
        h = wrong[0]
        hk, g = divmod(h, group)
        reach = float((k[:, hk].abs() @ q[hk, g].abs()).max()) if n else 0.0  # the dot's largest partial sums
        score = reach * sm_scale * LOG2E
        tail = f"validation found request {r}'s head {h} non-finite in {what} where the fp64 reference is finite"
        if reach / kv_scale > FP32_MAX / 2 or score > FP32_MAX / 2:
            raise SplitlabError(f"sm_scale={sm_scale!r} with these q and {k_name} overflows the fp32 scores: "
                                f"|sm_scale * log2(e) * q.k| may reach {score:.4g} (sum |q * k| = {reach:.4g}); "
                                f"expected both at most {FP32_MAX / 2:.4g} (half fp32's max: the kernels score in "
                                f"fp32); {tail}")
        vmax = float(v[:, hk].abs().max()) if n else 0.0
        out_max = float(torch.finfo(out.dtype).max)
        bound = min(FP32_MAX / (2 * n), out_max) if n else out_max
        if vmax > bound:
            raise SplitlabError(f"{v_name} holds V values up to |v| = {vmax:.4g} among the {n} keys request {r} "
                                f"attends; expected |v| <= {bound:.4g} (each split sums up to {n} rows of p * v, "
                                f"p <= 1, in fp32 before it normalises, and writes {out.dtype}); {tail}")
        raise SplitlabError(f"q, {k_name} and {v_name} are finite and within the bounds (scores {score:.4g}, "
                            f"|v| {vmax:.4g} over {n} keys), yet the fp32 kernels overflowed; {tail}")
