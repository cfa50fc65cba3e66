"""The cost of the launchers' validation (``splitlab.kernels._launch``: block table, lengths, sparse indices) on a GPU.

    python tests/gpu/bench_validation.py --out DIR [--reps 200] [--quick]
    python tests/gpu/bench_validation.py --out DIR --smoke     # a CPU dry run of this script (interpreter, tiny)

For a handful of GQA / MLA / sparse-MLA shapes (one request or token, where launch overhead dominates, and a batch
of 64 or 128) each launcher is called with ``validate=False`` and ``validate=True``, on two paths: explicit knobs
(the ``splitlab-default`` configuration of ``splitlab bench``: the planner's split count and tiles, resolved once;
validation off is the default there, no host sync) and ``num_splits=None`` (the planner runs; it syncs anyway and
validation is on by default). Sparse MLA has no lengths; its default is validation on.

Method: host wall-clock of one launcher call until the GPU has finished it (``time.perf_counter`` around
``fn(); torch.cuda.synchronize()``), the L2 flushed before every call (a 256 MB buffer zeroed and synchronised,
outside the timed region), the two modes interleaved call by call so that drift hits both; p20 / p50 / p80 by
``splitlab.bench.timing.quantiles``. CUDA-graph replay cannot time validation (its check is a host sync), and CUDA
events around back-to-back calls would hide the host time that the unvalidated calls spend launching, so the
wall clock of the whole call is what is compared. As a yardstick of the decode itself the unvalidated explicit
call is also timed by ``splitlab.bench.timing.time_events`` (``triton.testing.do_bench``: CUDA events, L2
flushed; p50), and by ``splitlab.bench.timing.time_graph`` (CUDA-graph replay over rotated input sets: the method
and configuration of ``splitlab bench``'s ``default_us``, so the kernels' own speed can be set beside earlier runs
of the same shapes, e.g. ``data/bench/h200/gqa_mqa`` and ``data/bench/h200/mla_sparse``). Each row
also checks that both modes returned the same output (``torch.equal``).

Writes ``DIR/validation_cost.csv`` and prints a table: the p50 of each mode and the difference.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's splitlab, installed or not

FIELDS = ["kernel", "shape", "batch", "keys", "path", "num_splits", "mode", "p20_us", "p50_us", "p80_us", "n",
          "cost_p50_us", "events_p50_us", "graph_p50_us", "same_output", "device", "torch", "triton", "method"]
METHOD = ("wall clock of launcher call + torch.cuda.synchronize, L2 flushed before each call, modes interleaved; "
          "p20/p50/p80 (splitlab.bench.timing.quantiles)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for validation_cost.csv (created)")
    ap.add_argument("--reps", type=int, default=200, help="timed calls per mode and path (default 200)")
    ap.add_argument("--quick", action="store_true", help="the small shapes only")
    ap.add_argument("--smoke", action="store_true",
                    help="a CPU dry run under TRITON_INTERPRET=1 with tiny shapes (checks the script; times nothing)")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error(f"--reps {a.reps} is not allowed; expected an integer >= 1")
    return a


def shapes(smoke: bool, quick: bool) -> list[dict]:
    """(kernel, label, workload) of each point: a single request / token and a large batch per kernel."""
    from splitlab import workloads
    from splitlab.workloads import DecodeWorkload

    if smoke:
        return [
            dict(kernel="gqa", shape="tiny gqa", w=DecodeWorkload("gqa", 2, 4, 2, 16, 16, 40, page_size=16,
                                                                  dtype="fp32")),
            dict(kernel="mla", shape="tiny mla", w=DecodeWorkload("mla", 2, 4, 1, 48, 32, 40, page_size=16,
                                                                  dtype="fp32")),
            dict(kernel="sparse_mla", shape="tiny sparse", w=DecodeWorkload("sparse_mla", 2, 4, 1, 48, 32, 64,
                                                                            page_size=1, topk=32, dtype="fp32")),
        ]
    pts = []
    for b, ctx in ([(1, 8192)] if quick else [(1, 8192), (64, 8192)]):
        pts.append(dict(kernel="gqa", shape="llama-3-8b 32/8/128 page 16",
                        w=workloads.get("llama-3-8b", batch=b, ctx_len=ctx, page_size=16)))
        pts.append(dict(kernel="mla", shape="deepseek-v3 128/576/512 page 64",
                        w=workloads.get("deepseek-v3-mla", batch=b, ctx_len=ctx, page_size=64)))
    for t in ([1] if quick else [1, 128]):
        pts.append(dict(kernel="sparse_mla", shape="sparse 64/512 top-k 2048, 65536 slots",
                        w=workloads.get("deepseek-v4-sparse-mla", batch=t, ctx_len=65536, topk=2048)))
    return pts


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any splitlab.kernels import (the interpreter is chosen then)
    import torch

    if not a.smoke and not torch.cuda.is_available():
        print("bench_validation: no CUDA GPU here (torch.cuda.is_available() is False); run it on the GPU "
              "machine, or pass --smoke for a CPU dry run of the script", file=sys.stderr)
        return 2
    import triton

    from splitlab.bench.decode import default_knobs
    from splitlab.bench.timing import quantiles, rotations, time_events, time_graph
    from splitlab.devices import detect
    from splitlab.devices import get as get_device
    from splitlab.kernels import gqa, mla, sparse_mla
    from splitlab.kernels.inputs import workload_inputs

    launchers = {"gqa": gqa.gqa_decode, "mla": mla.mla_decode, "sparse_mla": sparse_mla.sparse_mla_decode}
    spec = get_device("h200") if a.smoke else detect()
    os.environ.pop("SPLITLAB_VALIDATE", None)  # each call says what it wants
    device = "cpu" if a.smoke else "cuda"
    reps = min(a.reps, 2) if a.smoke else a.reps
    if a.smoke:
        def sync() -> None:
            pass

        def flush() -> None:
            pass
        dev_name = "cpu (smoke: interpreter, not a measurement)"
    else:
        sync = torch.cuda.synchronize
        l2 = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
        flush = l2.zero_
        dev_name = torch.cuda.get_device_name()

    rows = []
    for pt in shapes(a.smoke, a.quick):
        w, kernel = pt["w"], pt["kernel"]
        launch = launchers[kernel]
        x = workload_inputs(w, device=device, seed=1, draw_on="cpu" if a.smoke else "device")
        extra = {} if kernel == "gqa" else {"head_dim_v": w.head_dim_v}
        knobs = default_knobs(w, spec)  # splitlab bench's "splitlab-default" configuration
        paths = [("explicit", knobs)] + ([("planned", {})] if kernel != "sparse_mla" else [])
        for path, kn in paths:
            s = kn.get("num_splits")
            calls = {mode: functools.partial(launch, **x, **extra, **kn, validate=mode == "on")
                     for mode in ("off", "on")}
            outs = {mode: fn() for mode, fn in calls.items()}  # compile, warm, and the outputs compared
            for fn in calls.values():
                for _ in range(0 if a.smoke else 3):
                    fn()
            sync()
            same = bool(torch.equal(outs["off"], outs["on"]))
            samples: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(reps):
                for mode, fn in calls.items():
                    flush()
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    samples[mode].append((time.perf_counter() - t0) * 1e6)
            events = graph = None
            if not a.smoke and path == "explicit":
                events = time_events(calls["off"]).p50_us
                set_bytes = sum(t.numel() * t.element_size() for t in x.values())
                n_sets = rotations(min(set_bytes, w.kv_bytes), torch.cuda.get_device_properties(0).L2_cache_size)
                sets = [x] + [workload_inputs(w, device=device, seed=2 + i, draw_on="device")
                              for i in range(n_sets - 1)]
                graph = time_graph([functools.partial(launch, **xi, **extra, **kn, validate=False)
                                    for xi in sets]).p50_us
                sets = None
            p50 = {}
            for mode in ("off", "on"):
                q20, q50, q80 = quantiles(samples[mode])
                p50[mode] = q50
                rows.append(dict(kernel=kernel, shape=pt["shape"], batch=w.batch,
                                 keys=w.topk if kernel == "sparse_mla" else w.ctx_len, path=path,
                                 num_splits="planner" if s is None else s, mode=mode, p20_us=round(q20, 2),
                                 p50_us=round(q50, 2), p80_us=round(q80, 2), n=len(samples[mode]),
                                 cost_p50_us=round(p50["on"] - p50["off"], 2) if mode == "on" else "",
                                 events_p50_us="" if events is None or mode == "on" else round(events, 2),
                                 graph_p50_us="" if graph is None or mode == "on" else round(graph, 2),
                                 same_output=same, device=dev_name, torch=torch.__version__,
                                 triton=triton.__version__, method=METHOD))
        x = calls = outs = None  # the large inputs go before the next shape's
        if not a.smoke:
            torch.cuda.empty_cache()

    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "validation_cost.csv"
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    print(f"validation cost on {dev_name} ({METHOD}; {reps} calls a mode)")
    print(f"{'kernel':<11}{'batch':>6}{'keys':>7}  {'path':<9}{'splits':>8}{'off p50 us':>12}{'on p50 us':>11}"
          f"{'cost us':>9}{'cost %':>8}{'graph us':>10}  same")
    for off, on in zip(rows[::2], rows[1::2], strict=True):
        pct = 100.0 * on["cost_p50_us"] / off["p50_us"] if off["p50_us"] else float("nan")
        print(f"{off['kernel']:<11}{off['batch']:>6}{off['keys']:>7}  {off['path']:<9}{off['num_splits']!s:>8}"
              f"{off['p50_us']:>12.1f}{on['p50_us']:>11.1f}{on['cost_p50_us']:>9.1f}{pct:>8.1f}"
              f"{off['graph_p50_us'] if off['graph_p50_us'] != '' else '-':>10}  {off['same_output']}")
    print(f"wrote {path}")
    return 0 if all(r["same_output"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
