"""The decode benchmark behind ``splitlab bench``: splitlab's kernels at their default plan and at the best
of a small knob sweep, against PyTorch's decode paths, on one GPU, in one run.

Every timed splitlab configuration is first checked against the fp64 reference (bf16 tolerance); a
wrong one is reported and not timed. Per point it reports microseconds, unique-KV GB/s, TFLOP/s and the
roofline fraction ``max(kv_bytes / read_ceiling, flops / matrix_ceiling) / time`` with the ceilings
measured on the H200 (4.5 TB/s, 790 TFLOP/s; ``DeviceSpec.roofline_*``).
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from splitlab import families, workloads
from splitlab.bench import peers
from splitlab.bench.impls import resolve
from splitlab.bench.timing import Timing, rotations, time_events, time_graph
from splitlab.devices import DeviceSpec, detect
from splitlab.kernels.accuracy import TOLERANCE, references, rel_err
from splitlab.kernels.inputs import workload_inputs
from splitlab.workloads import DecodeWorkload


@dataclass
class Point:
    suite: str
    w: DecodeWorkload
    label: str
    rows: list[dict] = field(default_factory=list)


def _gqa(hq: int, hkv: int, batches, ctxs, suite: str) -> Iterator[Point]:
    for b, n in itertools.product(batches, ctxs):
        if b * n <= 64 * 8192:  # the largest KV kept: 64 x 8K (17 GB at 64 x 64K is left out)
            yield Point(suite, DecodeWorkload("gqa", b, hq, hkv, 128, 128, n, page_size=16), f"{hq}/{hkv}/128")


def _mla(h: int, batches, ctxs, dtype: str = "bf16", suite: str = "mla") -> Iterator[Point]:
    tag = "" if dtype == "bf16" else f"-{dtype}"
    for b, n in itertools.product(batches, ctxs):
        if b * n <= 64 * 8192:
            yield Point(suite, DecodeWorkload("mla", b, h, 1, 576, 512, n, page_size=64, dtype=dtype), f"mla{h}{tag}")


def _sparse(heads, topks, tokens, dqk: int = 512, dtype: str = "bf16", suite: str = "sparse") -> Iterator[Point]:
    tag = "" if dtype == "bf16" else f"-{dtype}"
    for h, k, t in itertools.product(heads, topks, tokens):
        yield Point(suite, DecodeWorkload("sparse_mla", t, h, 1, dqk, 512, 65536, topk=k, dtype=dtype),
                    f"smla{h}/{dqk}{tag}")


def suites(quick: bool) -> dict[str, list[Point]]:
    bs = [1, 4, 16, 64]
    ns = [1024, 8192, 65536]
    if quick:
        bs, ns = [1, 16], [8192, 65536]
    return {
        "gqa": [*_gqa(32, 8, bs, ns, "gqa"), *([] if quick else _gqa(64, 8, bs, ns, "gqa"))],
        "mqa": list(_gqa(128, 1, bs, ns, "mqa")),
        "mla": [*_mla(128, bs, ns), *_mla(16, bs, ns)],
        "sparse": [*_sparse([64], [2048], [1, 8, 32, 128] if not quick else [1, 128]),
                   *([] if quick else _sparse([16, 128], [512, 2048], [1, 8, 32, 128])),
                   *([] if quick else _sparse([128], [2048], [1, 32, 128], dqk=576))],
        # fp8 e4m3 caches beside a bf16 q (bytes halve; the bf16 rows of "mla"/"sparse" are the comparison)
        "fp8": [*_mla(128, bs[1:], ns[1:], "fp8_e4m3", "fp8"), *_mla(16, bs[1:], ns[1:], "fp8_e4m3", "fp8"),
                *_sparse([64], [2048], [32, 128], dtype="fp8_e4m3", suite="fp8"),
                *_sparse([128], [2048], [32, 128], dqk=576, dtype="fp8_e4m3", suite="fp8")],
    }


# --- splitlab's kernels: launch one config, and the knob space swept per family ----------------------
def _family(w: DecodeWorkload) -> tuple[Callable, Callable, Callable]:
    """(launcher, fp64 reference, launch facts) of the kernel for ``w``'s kind (its ``families`` record)."""
    f = families.by_kind(w.kind)
    return resolve(f.launcher), resolve(f.reference), resolve(f.launch_facts)


def default_knobs(w: DecodeWorkload, dev: DeviceSpec) -> dict:
    """The explicit knobs ``num_splits=None`` resolves to (the ``splitlab`` planner and the kernel's
    default tiles), so that the default is timed without the planner's host sync and Python cost."""
    facts = _family(w)[2](w, device=dev)
    return {k: getattr(facts, k) for k in families.by_kind(w.kind).knobs}


def split_candidates(w: DecodeWorkload, max_splits: int) -> list[int]:
    keys = w.keys_per_request
    return [s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256) if s <= max_splits and (s == 1 or keys // s >= 32)]


def tile_space(w: DecodeWorkload) -> list[dict]:
    if w.kind == "gqa":
        return [dict(block_n=bn, num_warps=nw, num_stages=ns)
                for bn, nw, ns in itertools.product([32, 64, 128], [4, 8], [2, 3, 4])]
    bhs = sorted({min(64, max(16, w.num_q_heads)), 16, 32})
    if w.kind == "mla":
        return [dict(block_n=bn, block_h=bh, num_warps=nw, num_stages=ns)
                for bn, bh, nw, ns in itertools.product([32, 64], bhs, [4, 8], [2, 3])
                if not (bh == 64 and nw == 4)]  # a 64 x 512 fp32 accumulator needs two warpgroups
    return [dict(block_k=bk, block_h=bh, num_warps=nw) for bk, bh, nw in itertools.product([32, 64], bhs, [4, 8])
            if not (bh == 64 and nw == 4)]


def _row(w: DecodeWorkload, dev: DeviceSpec, t: Timing, impl: str, config: dict, err: float) -> dict:
    floor_us = workloads.floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
    return dict(impl=impl, config=json.dumps(config, sort_keys=True), us=round(t.p50_us, 2),
                p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2), timing=t.method,
                gbps=round(w.kv_bytes / (t.p50_us * 1e3), 1), tflops=round(w.flops / (t.p50_us * 1e6), 2),
                roofline=round(floor_us / t.p50_us, 3), rel_err=err, status="ok")


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rotated_inputs(w: DecodeWorkload, *, device: str = "cuda", draw_on: str = "cpu", l2_bytes: int | None = None,
                   sets: int | None = None) -> list[dict]:
    """The input sets a graph timer rotates through for ``w``: seed 1 first (the one checked against the reference),
    then seeds 2, 3, ... up to ``sets`` in all (default: ``timing.rotations`` of the bytes a call reads, at most the
    first set's, against the L2 of ``device``'s GPU, or ``l2_bytes``)."""
    first = workload_inputs(w, device=device, seed=1, draw_on=draw_on)
    if sets is None:
        l2 = l2_bytes if l2_bytes is not None else torch.cuda.get_device_properties(device).L2_cache_size
        sets = rotations(min(_nbytes(first.values()), w.kv_bytes), l2)
    return [first] + [workload_inputs(w, device=device, seed=2 + i, draw_on=draw_on) for i in range(sets - 1)]


def bench_point(p: Point, dev: DeviceSpec, *, with_flex: bool, full_tiles: bool) -> None:
    """Check, then time, splitlab's default and a knob sweep (CUDA-graph replay over rotated inputs), then
    PyTorch's paths on the same shape (GQA only: PyTorch has no 576/512 MLA or sparse path)."""
    w = p.w
    kernel, ref_fn, facts_fn = _family(w)
    sets = rotated_inputs(w)
    first = sets[0]
    extra = {"head_dim_v": w.head_dim_v} if w.kind != "gqa" else {}
    tol = TOLERANCE[torch.bfloat16]

    ref_for = references(w, first, lambda x: ref_fn(**x, **extra))  # per head tile: an fp8 cache's q rounding

    def reference_for(knobs: dict) -> torch.Tensor:
        return ref_for(facts_fn(w, **knobs).block_h if w.kind != "gqa" else None)

    def try_config(impl: str, knobs: dict) -> dict | None:
        try:
            err = rel_err(kernel(**first, **extra, **knobs), reference_for(knobs))
            if not err <= tol:
                p.rows.append(dict(impl=impl, config=json.dumps(knobs, sort_keys=True), status="wrong", rel_err=err))
                return None
            t = time_graph([functools.partial(kernel, **x, **extra, **knobs) for x in sets])
            row = _row(w, dev, t, impl, knobs, err)
        except Exception as e:  # compile error, out of resources: keep the reason, go on
            p.rows.append(dict(impl=impl, config=json.dumps(knobs, sort_keys=True), status="error",
                               error=f"{type(e).__name__}: {str(e)[:200]}"))
            return None
        p.rows.append(row)
        return row

    try_config("splitlab-default", default_knobs(w, dev))
    # Stage 1: splits at the default tile. Stage 2: the tile space at the two best split counts.
    best = [r for r in (try_config("splitlab-sweep", {"num_splits": s})
                        for s in split_candidates(w, 256 if w.kind == "mla" else 64)) if r]
    best.sort(key=lambda r: r["us"])
    space = tile_space(w)
    tiles = space if full_tiles else space[:: max(1, len(space) // 6)]
    for r in best[: 2 if full_tiles else 1]:
        s = json.loads(r["config"])["num_splits"]
        for knobs in tiles:
            try_config("splitlab-sweep", {"num_splits": s, **knobs})
    if w.kind == "gqa":
        qkv = [peers.contiguous_kv(w.batch, w.num_q_heads, w.num_kv_heads, w.head_dim_qk, w.ctx_len, seed=i)
               for i in range(rotations(w.kv_bytes, torch.cuda.get_device_properties(0).L2_cache_size))]
        for backend in ("flash", "cudnn"):
            try:
                calls = [peers.sdpa(backend, *x) for x in qkv]
                p.rows.append(_row(w, dev, time_graph(calls), f"sdpa-{backend}", {}, float("nan")))
            except Exception as e:
                p.rows.append(dict(impl=f"sdpa-{backend}", config="{}", status="error", error=str(e)[:200]))
        if with_flex and w.ctx_len <= 8192 and w.group <= 8:  # compiles per shape; MQA-128 takes seconds a call
            try:  # compiled per shape; timed by events with the L2 flushed (its launches are Inductor's)
                p.rows.append(_row(w, dev, time_events(peers.flex(*qkv[0])), "flex", {}, float("nan")))
            except Exception as e:
                p.rows.append(dict(impl="flex", config="{}", status="error", error=str(e)[:200]))
        del qkv


def summarize(p: Point) -> dict:
    ok = [r for r in p.rows if r.get("status") == "ok"]
    by = {}
    for r in ok:
        if r["impl"] not in by or r["us"] < by[r["impl"]]["us"]:
            by[r["impl"]] = r
    sweep = [r for r in ok if r["impl"].startswith("splitlab")]
    best = min(sweep, key=lambda r: r["us"]) if sweep else None
    peer = min((by[k] for k in ("sdpa-flash", "sdpa-cudnn") if k in by), key=lambda r: r["us"], default=None)
    w = p.w
    return dict(
        suite=p.suite, shape=p.label, batch=w.batch, ctx=w.ctx_len if w.kind != "sparse_mla" else w.topk,
        kv_mb=round(w.kv_bytes / 2**20, 1),
        default_us=by.get("splitlab-default", {}).get("us"),
        best_us=best["us"] if best else None, best_config=best["config"] if best else None,
        best_gbps=best["gbps"] if best else None, best_tflops=best["tflops"] if best else None,
        best_roofline=best["roofline"] if best else None,
        sdpa_flash_us=by.get("sdpa-flash", {}).get("us"), sdpa_cudnn_us=by.get("sdpa-cudnn", {}).get("us"),
        flex_us=by.get("flex", {}).get("us"),
        speedup_vs_sdpa=round(peer["us"] / best["us"], 2) if (peer and best) else None,
        wrong=sum(r.get("status") == "wrong" for r in p.rows), errors=sum(r.get("status") == "error" for r in p.rows),
    )


def run(names: list[str], out: Path, *, quick: bool = False, with_flex: bool = True, full_tiles: bool = True,
        progress: bool = True) -> list[dict]:
    """Benchmark the named suites; write ``points.csv`` (every timed config) and ``summary.csv`` to ``out``."""
    dev = detect()
    out.mkdir(parents=True, exist_ok=True)
    allp = [pt for n in names for pt in suites(quick)[n]]
    env = dict(device=torch.cuda.get_device_name(), sms=dev.sm_count, torch=torch.__version__,
               triton=__import__("triton").__version__, cuda=torch.version.cuda,
               started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), read_ceiling_gbps=dev.roofline_gbps,
               matrix_ceiling_tflops=dev.roofline_tflops)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    summaries = []
    t0 = time.time()
    for i, pt in enumerate(allp):
        bench_point(pt, dev, with_flex=with_flex, full_tiles=full_tiles)
        torch.cuda.empty_cache()
        s = summarize(pt)
        summaries.append(s)
        if progress:
            print(f"[{i + 1}/{len(allp)} {time.time() - t0:.0f}s] " + " ".join(f"{k}={v}" for k, v in s.items()
                                                                            if k != "best_config"), flush=True)
        with open(out / "points.csv", "a", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["suite", "shape", "batch", "ctx", "impl", "config", "us", "p20_us",
                                               "p80_us", "timing", "gbps", "tflops", "roofline", "rel_err",
                                               "status", "error"])
            if f.tell() == 0:
                wr.writeheader()
            for r in pt.rows:
                wr.writerow(dict(suite=pt.suite, shape=pt.label, batch=pt.w.batch, ctx=s["ctx"]) | r)
    with open(out / "summary.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(summaries[0]))
        wr.writeheader()
        wr.writerows(summaries)
    return summaries


def format_summary(rows: list[dict]) -> str:
    cols = ["suite", "shape", "batch", "ctx", "default_us", "best_us", "best_gbps", "best_tflops", "best_roofline",
            "sdpa_flash_us", "sdpa_cudnn_us", "flex_us", "speedup_vs_sdpa", "wrong", "errors"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None or (isinstance(r.get(c), float) and math.isnan(r[c]))
                                       else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)
