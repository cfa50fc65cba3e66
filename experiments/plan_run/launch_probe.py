"""Where a ``run()`` call's host time goes on a GPU: Triton's launch path piece by piece (one H200).

    python experiments/plan_run/launch_probe.py --out OUT

For GQA 32/8/128 (page 16) and MLA-128 (576/512, page 64), a plan of one short request (so that the GPU is never
the bottleneck: wall time per call is the host's), the host time per call (``time.perf_counter`` over ``--calls``
back-to-back calls, then one sync; best of 3) of:

* ``run``: ``plan.run(out=out, check=False)`` (the partial kernel and, where split, the merge), through
  ``kernels.bound_launch`` (the default); ``run-triton``: the same with ``decode_plan.BOUND_LAUNCH`` off (Triton's
  own launch path every call); ``run-checked``: ``plan.run(...)`` as a user calls it (its checks, a new output);
  its pieces ``checks`` (``_check_common``), ``outputs`` (the output's allocation) and ``guard`` (the device
  guard's enter and exit, empty);
* ``bound``: the partial kernel alone through a ``BoundLaunch``;
* ``jit``: the partial kernel launched as ``run`` launches it (``kernel[grid](...)``, Triton's whole path);
* ``bind``: Triton's binding and cache lookup alone (``kernel.run(..., warmup=True)``: no launch);
* ``direct``: the compiled kernel's launcher called with its arguments already bound (``CompiledKernel.run``);
* ``direct-ints``: the same with every tensor passed as its address (an int: the launcher then neither calls
  ``data_ptr()`` nor asks the driver what the pointer is);
* ``direct+args``: the same, the argument list rebuilt each call from the call's tensors (what a cached launch
  would do).

For MLA-128, whose ``run`` takes the Gluon seesaw kernel (``kernels.mla_sm90_ws``), also the pieces of that launch:
``ws-descriptors`` (the two TMA descriptors' Python objects, ``mla_sm90_ws.descriptors``; ``ws-descriptors-checked``
the same two through ``TensorDescriptor``'s constructor and its checks), ``ws-tensordesc`` (the
launcher's encoding of both into CUtensorMaps, ``make_tensordesc_arg``, every call), ``ws-launch``
(``mla_sm90_ws.launch``: descriptors, Gluon's binding and the launch) and ``run-tma-every-call`` (``run`` with
``bound_launch.KEEP_TMA`` off: the bound call encodes its descriptors every call, as Triton's launcher does).

Writes OUT/launch_probe.csv. The outputs of ``direct`` and ``bound`` are compared with ``jit``'s (equal to the
bit: ``direct_equal``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import triton

from splitlab.bench.csvrows import write_rows
from splitlab.kernels import bound_launch, decode_plan
from splitlab.kernels import worklist as _wl
from splitlab.kernels.bound_launch import BoundLaunch
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan
from splitlab.kernels.inputs import gqa_inputs, mla_inputs


def host_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t
        torch.cuda.synchronize()
        best = min(best, dt / calls * 1e6)
    return best


def partial_call(plan, family: str, q, caches, bt, out, lse):
    """The partial kernel's (function, grid, args, kwargs) exactly as ``plan.run`` passes them."""
    p = plan._planned
    if family == "gqa":
        k, v = caches
        args = (q, k, v, bt, plan._items, plan._cta_offsets, out, lse, plan._po, plan._pl, plan._qk_scale,
                plan.num_kv_heads, plan._group, k.shape[0], bt.shape[1] * plan.page_size, *q.stride(), *k.stride(),
                *v.stride(), *bt.stride(), *out.stride(), *lse.stride(), *plan._po_strides, *plan._pl_strides)
        return _wl._gqa_worklist_kernel, p.grid, args, {**plan._meta_kw, **plan._bounded}
    (kv,) = caches
    args = (q, kv, bt, plan._items, plan._cta_offsets, out, lse, plan._po, plan._pl, plan.num_heads, plan.groups,
            plan._qk_scale, plan._kv_scale, kv.shape[0], bt.shape[1] * plan.page_size, *q.stride(), *kv.stride(),
            *bt.stride(), *out.stride(), *lse.stride(), *plan._po_strides, *plan._pl_strides)
    return _wl._mla_worklist_kernel, p.grid, args, {**plan._meta_kw, **plan._bounded}


def probe(family: str, calls: int) -> list[dict]:
    dev = torch.device("cuda")
    if family == "gqa":
        plan = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device=dev, scheduler="uniform", num_splits=2)
        d = gqa_inputs(1, 32, 8, 128, 64, page_size=16, dtype=torch.bfloat16, device=dev)
        q, k, v, bt, lens = d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["seq_lens"]
        caches = (k, v)
        run = lambda: plan.run(q, k, v, bt, out=out, check=False)  # noqa: E731
    else:
        plan = MLADecodePlan(128, 576, 512, 64, dtype=torch.bfloat16, device=dev, scheduler="uniform", num_splits=2)
        d = mla_inputs(1, 128, 576, 128, page_size=64, dtype=torch.bfloat16, device=dev)
        q, kv, bt, lens = d["q"], d["kv_cache"], d["block_table"], d["seq_lens"]
        caches = (kv,)
        run = lambda: plan.run(q, kv, bt, out=out, check=False)  # noqa: E731
    plan.plan([int(x) for x in lens.tolist()])
    out = torch.empty(q.shape[0], q.shape[1], plan.head_dim_v, dtype=q.dtype, device=dev)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=dev)
    fn, grid, args, kw = partial_call(plan, family, q, caches, bt, out, lse)
    compiled = fn[grid](*args, **kw)
    torch.cuda.synchronize()
    ref = out.clone()
    bound = fn.signature.bind(*args, **{k: v for k, v in kw.items() if k in fn.arg_names})
    bound.apply_defaults()
    values = list(bound.arguments.values())
    g = tuple(grid) + (1,) * (3 - len(grid))

    def direct(vals=values):
        stream = torch.cuda.current_stream().cuda_stream
        compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None, None, *vals)

    ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in values]

    def direct_args():
        fn2, _, a, k2 = partial_call(plan, family, q, caches, bt, out, lse)
        direct(list(a) + [k2[n] if n in k2 else values[i] for i, n in enumerate(fn.arg_names) if i >= len(a)])

    same = True
    for vals in (values, ints):
        out.fill_(float("nan"))
        direct(vals)
        torch.cuda.synchronize()
        same = same and bool(torch.equal(out, ref))
    rows = []
    bound = BoundLaunch(fn, **kw)
    def guard():
        with plan._guard():
            pass

    checked = (lambda: plan.run(q, k, v, bt)) if family == "gqa" else (lambda: plan.run(q, kv, bt))  # noqa: E731
    pieces = {"run": run, "run-triton": run, "run-checked": checked,
              "checks": lambda: plan._check_common(plan._planned, q, bt, None, None, dict(zip(
                  ("k_cache", "v_cache") if family == "gqa" else ("kv_cache",), caches, strict=True))),
              "outputs": lambda: plan._outputs(plan._planned, None, None, False), "guard": guard,
              "jit": lambda: fn[grid](*args, **kw),
              "bind": lambda: fn.run(*args, grid=grid, warmup=True, **kw), "direct": direct,
              "direct-ints": lambda: direct(ints), "direct+args": direct_args,
              "bound": lambda: bound.launch(grid, *args)}
    out.fill_(float("nan"))
    bound.launch(grid, *args)
    bound.launch(grid, *args)
    torch.cuda.synchronize()
    same = same and bound.hits == 1 and bool(torch.equal(out, ref))
    outs = []
    for on in (False, True):  # run() through Triton and through BoundLaunch: the same bits
        decode_plan.BOUND_LAUNCH = on
        for _ in range(2):
            out.fill_(float("nan"))
            run()
        torch.cuda.synchronize()
        outs.append(out.clone())
    same = same and bool(torch.equal(outs[0], outs[1])) and plan._bound_partial.hits > 0
    if family == "mla" and plan._ws:
        try:
            pieces.update(gluon_pieces(plan, q, kv, bt, out, lse))
        except Exception as e:  # a probe of Triton's internals: the other pieces still count
            print(f"gluon pieces: {type(e).__name__}: {e}", flush=True)
    if family == "mla":
        pieces["run-tma-every-call"] = run
    for name, f in pieces.items():
        decode_plan.BOUND_LAUNCH = name != "run-triton"
        bound_launch.KEEP_TMA = name != "run-tma-every-call"
        f()
        rows.append(dict(family=family, piece=name, host_us=round(host_us(f, calls), 2), args=len(values),
                         direct_equal=same, torch=torch.__version__, triton=triton.__version__,
                         gpu=torch.cuda.get_device_name()))
        print(rows[-1], flush=True)
    return rows


def gluon_pieces(plan, q, kv, bt, out, lse) -> dict:
    """The Gluon seesaw launch of ``plan.run`` in pieces (the module docstring)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    from splitlab.kernels import mla_sm90_ws as ws

    slots = plan._planned.grid[0] // plan.groups

    def launch():
        ws.launch(q, kv, bt, plan._items, slots, out, lse, plan._po, plan._pl, plan._qk_scale, ws.DEFAULT_VARIANT)

    launch()
    torch.cuda.synchronize()
    kernel = next(iter(ws._mla_ws_kernel.device_caches[torch.cuda.current_device()][0].values()))
    meta = kernel.metadata.tensordesc_meta

    def encode():
        for d, m in zip(ws.descriptors(q, kv), meta, strict=True):
            make_tensordesc_arg(d, m)

    def checked():  # the descriptors through TensorDescriptor's constructor and its checks
        rows = kv.shape[0] * kv.shape[1]
        layout = ws.box_layout(q.dtype)
        ws.TensorDescriptor(q, [q.shape[0] * q.shape[1], 576], [q.stride(1), 1], [ws.BLOCK_H, ws.PIECE], layout)
        ws.TensorDescriptor(kv, [rows, 576], [kv.stride(1), 1], [ws.BLOCK_N, ws.PIECE], layout)

    return {"ws-descriptors": lambda: ws.descriptors(q, kv), "ws-descriptors-checked": checked,
            "ws-tensordesc": encode, "ws-launch": launch}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = probe("gqa", a.calls) + probe("mla", a.calls)
    write_rows(a.out / "launch_probe.csv", rows)


if __name__ == "__main__":
    main()
