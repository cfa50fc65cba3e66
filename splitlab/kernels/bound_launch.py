"""A jitted kernel launched through its compiled binary's launcher, without Triton's per-call argument binding.

``kernel[grid](*args, **meta)`` binds every argument on every call (a specialization of each, a cache key, the
defaults, a check of the globals) before the driver call. A decode plan (``kernels.decode_plan``) launches the same
kernels with the same meta-parameters once per layer, so ``BoundLaunch`` pays that once per *specialization*: the
first call of each goes through Triton (compiling where needed, and launching), and later calls with arguments of
the same specialization call the compiled kernel's launcher (``CompiledKernel.run``) with the arguments in the
kernel's parameter order. What it costs per call, and what it saves, is measured on the H200 by
``experiments/plan_run/launch_probe.py``.

The specialization (``spec_key``) is at least as fine as Triton's own (``triton.runtime.jit``'s binder: a tensor's
dtype and 16-byte alignment; an int's value 1, its divisibility by 16 and its integer width; a Gluon TMA descriptor's
type string ``tensordesc<dtype[block],layout>``, here its class, base dtype, block shape, layout and padding), so two
calls of one key always run the binary Triton itself would pick (``tests/test_bound_launch.py`` holds the
descriptor's key against Triton's native one). Triton's path is kept, every call, under the interpreter, with a
launch hook installed (a profiler: ``triton.knobs.runtime.launch_enter_hook``), and for arguments of any other type
(``spec_key`` returns None).

Computing ``spec_key`` is most of a bound call's Python (a plan's kernels take 50-55 arguments), so a call is looked
up first by a cheaper key: its non-tensor arguments' values and types, taken by position at C speed, its tensors'
dtypes and alignment and its TMA descriptors' classes (``_Split``), which fix ``spec_key``'s class; only a call that
key has not seen computes ``spec_key``. The stream is read as Triton's launch path reads it (its driver's getters).

A kernel with Gluon TMA descriptors has a further cost in Triton's launcher: it walks every argument in Python and
encodes each descriptor's ``CUtensorMap`` (``cuTensorMapEncodeTiled``) on every call. ``_TmaLaunch`` keeps each
encoding by what it is made of (the descriptor's position, base address, shape, strides and padding, for one
compiled kernel: the same bytes), and calls the C launcher under Triton's wrapper with the encoded arguments; where
the wrapper is not the one it reads (``_tma_launch``: triton 3.6's ``wrap_handle_tensordesc``, no scratch
buffers), the compiled kernel's own ``run``.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

import torch

from splitlab.kernels._launch import INTERPRET

try:
    from triton import knobs
except ImportError:  # pragma: no cover - a triton without knobs: Triton's path every call
    knobs = None

_I32 = (-(2**31), 2**31)
_U64 = 2**63


def _hooked(hook: object) -> bool:
    """Whether a launch hook is installed: a callable (triton 3.4-3.5), or a chain with calls (3.6's ``HookChain``,
    never None)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _int_key(v: int) -> tuple:
    width = 0 if _I32[0] <= v < _I32[1] else (1 if -_U64 <= v < _U64 else 2)
    return (v == 1, v % 16 == 0, width)


def _descriptor_key(a: object) -> tuple | None:
    """A Gluon host TMA descriptor's class (``triton.experimental.gluon.nvidia.hopper.TensorDescriptor``: ``base``,
    ``block_shape``, ``layout``, ``padding``), else None. Its shape and strides are run-time arguments of the launch
    (the launcher encodes the CUtensorMap every call), not part of the specialization."""
    layout = getattr(a, "layout", None)
    base = getattr(a, "base", None)
    if layout is None or not isinstance(base, torch.Tensor) or not hasattr(a, "block_shape"):
        return None
    return ("desc", type(a), base.dtype, tuple(a.block_shape), layout, getattr(a, "padding", None))


def spec_key(args: tuple) -> tuple | None:
    """Each positional argument's specialization class (None: an argument this module does not classify)."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            key.append(("b", a))
        elif isinstance(a, int):
            key.append(_int_key(a))
        elif isinstance(a, float):
            key.append("f")
        elif a is None:
            key.append(None)
        else:
            d = _descriptor_key(a)
            if d is None:
                return None
            key.append(d)
    return tuple(key)


#: Fast keys a ``BoundLaunch`` keeps before it forgets them (each new plan's sizes make one).
FAST_KEYS = 256
_stream_of: Callable[[], int] | None = None


def _current_stream() -> int:
    """The current CUDA stream's handle, read as Triton's own launch path reads it (its driver's getters: C calls,
    not ``torch.cuda.current_stream()``'s objects)."""
    global _stream_of
    if _stream_of is None:
        from triton.runtime.driver import driver

        d = driver.active
        _stream_of = lambda: d.get_current_stream(d.get_current_device())  # noqa: E731
    return _stream_of()


def _getter(idx: list[int]) -> Callable[[tuple], tuple]:
    """``args -> tuple(args[i] for i in idx)`` at C speed (``itemgetter`` returns a bare item for one index)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda a: (a[i],)
    return itemgetter(*idx) if idx else (lambda a: ())


class _Split:
    """The positions of a call's tensors, of its Gluon TMA descriptors and of its other arguments (ints, floats,
    bools, None), from a classified call: a later call's fast key is its other arguments' values and types, its
    tensors' dtypes and alignment and its descriptors' ``spec_key`` class, the same or a finer class than
    ``spec_key``'s (two calls of one fast key always have one ``spec_key``)."""

    def __init__(self, args: tuple) -> None:
        self.n = len(args)
        kind = [0 if isinstance(a, torch.Tensor) else 1 if _descriptor_key(a) is not None else 2 for a in args]
        self.tensors = _getter([i for i, k in enumerate(kind) if k == 0])
        self.descs = _getter([i for i, k in enumerate(kind) if k == 1]) if 1 in kind else None
        self.others = _getter([i for i, k in enumerate(kind) if k == 2])

    def key(self, grid_len: int, args: tuple) -> tuple:
        """The fast key of ``args`` (TypeError or AttributeError where an argument is not of its position's kind:
        a tensor where another kind was, an unhashable one)."""
        ts = self.tensors(args)
        others = self.others(args)
        descs = () if self.descs is None else tuple(map(_descriptor_key, self.descs(args)))
        return (grid_len, others, tuple(map(type, others)), tuple(t.dtype for t in ts),
                tuple(t.data_ptr() % 16 == 0 for t in ts), descs)


#: Encoded descriptors a ``_TmaLaunch`` keeps before it forgets them (a decode step's layers each make one).
TMA_KEYS = 256
#: Off: every bound call of a kernel with TMA descriptors takes Triton's launcher, which encodes them again (the A/B
#: of ``experiments/plan_run/launch_probe.py``).
KEEP_TMA = True
_BASE_ARGS = 13  # Triton's C launcher's leading arguments (grid, stream, function, options, scratch, metadata, hooks)


class _TmaLaunch:
    """A compiled kernel's launch with its TMA descriptors' encodings kept (the module docstring): the C launcher
    ``launcher`` under Triton's wrapper, the descriptors' positions among the call's arguments and each one's
    metadata (swizzle, element type, block), ``encode`` Triton's own ``make_tensordesc_arg``."""

    def __init__(self, compiled: Any, launcher: Callable, positions: list[int], metas: list, encode: Callable) -> None:
        run = compiled.run
        self.head = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                     compiled.packed_metadata, None, None, None)
        self.launcher, self.encode = launcher, encode
        self.descs = list(zip(positions, metas, strict=True))
        self.encoded: dict[tuple, list] = {}

    def __call__(self, g: tuple, stream: int, args: tuple, tail: list) -> None:
        out = [g[0], g[1], g[2], stream, *self.head]
        prev = 0
        for pos, meta in self.descs:
            d = args[pos]
            key = (pos, d.base.data_ptr(), *d.shape, *d.strides, d.padding)
            enc = self.encoded.get(key)
            if enc is None:
                if len(self.encoded) >= TMA_KEYS:
                    self.encoded.clear()
                enc = self.encoded[key] = self.encode(d, meta)
            out.extend(args[prev:pos])
            out.extend(enc)
            prev = pos + 1
        out.extend(args[prev:])
        out.extend(tail)
        self.launcher(*out)


def _tma_launch(compiled: Any, args: tuple) -> _TmaLaunch | None:
    """A ``_TmaLaunch`` for ``compiled`` called with ``args`` where they hold Gluon TMA descriptors and Triton's
    launcher wraps its C launcher as triton 3.6 does (``wrap_handle_tensordesc``'s closure: the C launcher, the
    descriptors' parameter indices, their metadata), with no scratch buffer to allocate a call; else None."""
    positions = [i for i, a in enumerate(args) if _descriptor_key(a) is not None]
    run = getattr(compiled, "run", None)
    inner = getattr(run, "launch", None)
    closure, code = getattr(inner, "__closure__", None), getattr(inner, "__code__", None)
    if not positions or not closure or code is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure), strict=False))
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:  # pragma: no cover - not the CUDA backend
        return None
    launcher, indices, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
    if (not callable(launcher) or getattr(nv, "_BASE_ARGS_FORMAT_LEN", None) != _BASE_ARGS
            or not callable(getattr(nv, "make_tensordesc_arg", None)) or set(indices or ()) != set(positions)
            or not metas or len(metas) != len(positions) or any(m is None for m in metas)
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)):
        return None
    return _TmaLaunch(compiled, launcher, positions, list(metas), nv.make_tensordesc_arg)


class BoundLaunch:
    """``fn`` (a ``triton.jit`` function) with its keyword arguments ``meta`` (constexprs, options, the kernel's
    defaulted parameters) fixed; ``launch(grid, *args)`` launches it on the current stream with ``args`` as its
    leading positional parameters (the module docstring). ``hits`` counts the calls that bypassed Triton's binding
    (for tests)."""

    def __init__(self, fn: Any, **meta: Any) -> None:
        self.fn, self.meta = fn, meta
        self._compiled: dict[tuple, tuple[Any, list, _TmaLaunch | None]] = {}
        self._split: _Split | None = None
        self._fast: dict[tuple, tuple[Any, list, _TmaLaunch | None]] = {}
        self.hits = 0

    def _tail(self, n_args: int) -> list:
        params = self.fn.signature.parameters
        return [self.meta[name] if name in self.meta else params[name].default for name in self.fn.arg_names[n_args:]]

    def launch(self, grid: tuple[int, ...], *args: Any) -> None:
        hooked = knobs is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)
        if INTERPRET or hooked:
            self.fn[grid](*args, **self.meta)
            return
        # The fast key first (a plan's later calls: the same sizes and strides, new tensors), then spec_key.
        split, fast, hit = self._split, None, None
        if split is not None and split.n == len(args):
            try:
                fast = split.key(len(grid), args)
                hit = self._fast.get(fast)
            except (TypeError, AttributeError):  # an argument of another kind at a position: the classified path
                fast = None
        if hit is None:
            key = spec_key(args)
            hit = None if key is None else self._compiled.get((len(grid), key))
            if hit is None:
                compiled = self.fn[grid](*args, **self.meta)
                if key is not None and hasattr(compiled, "run"):
                    self._compiled[(len(grid), key)] = (compiled, self._tail(len(args)), _tma_launch(compiled, args))
                    if self._split is None:
                        self._split = _Split(args)
                return
            if fast is not None:
                if len(self._fast) >= FAST_KEYS:
                    self._fast.clear()
                self._fast[fast] = hit
        compiled, tail, tma = hit
        g = (*grid, 1, 1)
        if tma is not None and KEEP_TMA:
            tma(g, _current_stream(), args, tail)
        else:
            compiled.run(g[0], g[1], g[2], _current_stream(), compiled.function, compiled.packed_metadata, None, None,
                         None, *args, *tail)
        self.hits += 1


def bound_for(kernel: Any, cache: dict, meta: dict) -> BoundLaunch:
    """The ``BoundLaunch`` of ``kernel`` at ``meta`` kept in ``cache`` (a module's own dict, keyed by the kernel and
    the meta-parameters; made at its first use, remade where the kernel object under that name changed)."""
    key = (id(kernel), tuple(meta.items()))
    b = cache.get(key)
    if b is None or b.fn is not kernel:
        b = cache[key] = BoundLaunch(kernel, **meta)
    return b


def launch_cached(kernel: Any, cache: dict, grid: tuple[int, ...], args: tuple, meta: dict, *,
                  bound: bool = True) -> None:
    """``kernel[grid](*args, **meta)``; with ``bound``, through ``bound_for(kernel, cache, meta)``."""
    if not bound:
        kernel[grid](*args, **meta)
        return
    bound_for(kernel, cache, meta).launch(grid, *args)


__all__ = ["FAST_KEYS", "KEEP_TMA", "TMA_KEYS", "BoundLaunch", "bound_for", "launch_cached", "spec_key"]
