"""GQA's short launches on the H200 (README.md): the work-list path's two variants (``kernels.worklist``:
programmatic dependent launch between the partial kernel and the merge, ``pdl=``; the merge fused into the partial
kernel, ``fused_merge=True``) against the plain work-list launch, the shipped split-count kernel at its planner's
split count, and SDPA cuDNN / flash.

    python experiments/short_launch/ab.py run --out DIR [--budget-s S]     # one H200: DIR/short_launch_ab.csv
    python experiments/short_launch/ab.py run --out DIR --dry-run         # the CPU: tiny shapes, interpreter, no timing
    python experiments/short_launch/ab.py summary DIR/short_launch_ab.csv

Per point, every implementation's output is checked against the fp64 reference first (its output buffers NaN before
the launch, the cache rows no request reads NaN; a fused launch must leave its counters 0); one that fails is a row
``wrong`` and is not timed. Then CUDA-graph replay (``bench.timing.time_graph``, input sets rotated past the L2).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CSV_NAME = "short_launch_ab.csv"
FIELDS = ("point", "hq", "hkv", "batch", "keys", "page", "impl", "schedule", "splits", "ctas", "sets", "us",
          "p20_us", "p80_us", "roofline", "rel_err", "lse_err", "status", "error", "elapsed_s")
#: The work-list variants (name -> gqa_decode_scheduled's keywords); "wl-plain" is the launch both vary.
VARIANTS = {"wl-plain": {}, "wl-pdl-start": {"pdl": "start"}, "wl-pdl-end": {"pdl": "end"},
            "wl-fused": {"fused_merge": True}}
#: The schedules the variants run (``planners.schedulers.schedule``): ``uniform`` at the planner's split count (the
#: shipped kernel's split, so the launch is what differs) and ``splitlab``'s cost-model schedule.
SCHEDULES = ("uniform", "splitlab")
PEERS = ("sdpa-cudnn", "sdpa-flash")
DEVICE = "h200"  # the planner's and the roofline's preset


@dataclass(frozen=True)
class Config:
    heads: tuple[tuple[int, int], ...]
    batches: tuple[int, ...]
    keys: tuple[int, ...]
    pages: tuple[int, ...]
    head_dim: int
    timed: bool


#: GQA 32/8 and 64/8 and MQA-128 at batch 1-64 and 1K-4K keys, pages 16 and 64 (72 points). Batch 16 and 64 first:
#: the issue's worst shapes lead, so that a budget cut leaves the tail.
GPU = Config(heads=((32, 8), (64, 8), (128, 1)), batches=(16, 64, 4, 1), keys=(1024, 2048, 4096), pages=(16, 64),
             head_dim=128, timed=True)
#: The CPU under Triton's interpreter: the same code at tiny sizes (odd lengths via the planner's splits), checks only.
DRY = Config(heads=((8, 2), (16, 1)), batches=(3,), keys=(40, 130), pages=(16,), head_dim=32, timed=False)


def points(cfg: Config) -> list[tuple[int, int, int, int, int]]:
    """``(hq, hkv, batch, keys, page)`` in run order: keys, then batch (``cfg``'s order), heads, page."""
    return [(hq, hkv, b, n, p) for n in cfg.keys for b in cfg.batches for hq, hkv in cfg.heads for p in cfg.pages]


def workload(hq: int, hkv: int, batch: int, keys: int, page: int, head_dim: int):
    from splitlab.workloads import DecodeWorkload

    return DecodeWorkload(kind="gqa", num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=head_dim, head_dim_v=head_dim,
                          batch=batch, ctx_len=keys, page_size=page, dtype="bf16")


class Writer:
    """The CSV, its header written at once, one flushed row at a time (a cut run keeps what it measured)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        self.w.writeheader()
        self.f.flush()
        self.t0 = time.time()

    def row(self, **r) -> None:
        unknown = set(r) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown CSV fields {sorted(unknown)}")
        r["elapsed_s"] = round(time.time() - self.t0, 2)
        self.w.writerow(r)
        self.f.flush()
        print(",".join(str(r.get(k, "")) for k in FIELDS), flush=True)


def poisoned_allocs():
    """``kernels.inputs.poisoned_allocs``: every buffer the launchers allocate starts NaN."""
    from splitlab.kernels.inputs import poisoned_allocs

    return poisoned_allocs()


def verdict(out, lse, ref, ref_lse, dtype, counters=None) -> tuple[float, float, str, str]:
    """``(rel_err, lse_err, status, why)`` of an output (and lse, None for a peer) against fp64: ``ok`` within
    ``kernels.accuracy``'s tolerances of ``dtype``, no NaN, counters (the fused merge's) back at 0; else ``wrong``."""
    import torch

    from splitlab.kernels.accuracy import LSE_TOLERANCE, TOLERANCE, lse_err, rel_err

    err = rel_err(out, ref)
    lerr = math.nan if lse is None else lse_err(lse, ref_lse)
    why = []
    if bool(torch.isnan(out).any()):
        why.append("NaN in out")
    if not err <= TOLERANCE[dtype]:
        why.append(f"rel_err {err:.3g} > {TOLERANCE[dtype]}")
    if lse is not None and not lerr <= LSE_TOLERANCE[dtype]:
        why.append(f"lse_err {lerr:.3g} > {LSE_TOLERANCE[dtype]}")
    if counters is not None and bool(counters.ne(0).any()):
        why.append(f"{int(counters.ne(0).sum())} counters not 0 after the launch")
    return err, lerr, ("wrong" if why else "ok"), "; ".join(why)


def splitlab_impls(x: dict, w, dev) -> list[tuple[str, str, int, int, object]]:
    """``(impl, schedule, splits, ctas, make)``: ``make(x, counters)`` returns one decode call on input set ``x``
    (``counters``: that set's fused-merge counters), returning ``(out, lse)``."""
    from splitlab.kernels.gqa import gqa_decode
    from splitlab.kernels.worklist import WorkList, gqa_decode_scheduled
    from splitlab.planners import default_plan, schedulers

    splits = default_plan(w, dev).num_splits
    impls = [("shipped", "split-count", splits, w.batch * splits,
              lambda x, c: lambda: gqa_decode(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                              num_splits=splits, return_lse=True))]
    for name in SCHEDULES:
        s = schedulers.schedule(w, dev, name)
        work = WorkList.from_schedule(s, x["q"].device)
        for impl, kw in VARIANTS.items():
            def make(x, c, work=work, kw=kw):
                extra = dict(kw, counters=c) if kw.get("fused_merge") else kw
                return lambda: gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work,
                                                    return_lse=True, **extra)
            impls.append((impl, name, max(s.partials), s.ctas, make))
    return impls


def dense_reference(q, k, v):
    """fp64 SDPA (torch's math path) of a peer's contiguous inputs: ``[B, Hq, 1, D]`` -> ``[B, Hq, D]``."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        return scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)[:, :, 0]


def run(out_dir: Path, cfg: Config, budget_s: float, only: str | None = None) -> Path:
    """Check, then time, every point of ``cfg`` (``only``: one implementation and the shipped kernel, for a test)."""
    import torch

    from splitlab import devices
    from splitlab.bench.peers import contiguous_kv, sdpa
    from splitlab.bench.timing import rotations, time_graph
    from splitlab.kernels import reference
    from splitlab.kernels.inputs import gqa_inputs, poison_unread_pages_
    from splitlab.workloads import floor_time_us

    path = out_dir / CSV_NAME
    out = Writer(path)
    dev = devices.get(DEVICE)
    on_gpu = cfg.timed
    device = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16
    todo = points(cfg)
    for i, (hq, hkv, batch, n, page) in enumerate(todo):
        base = dict(point=i, hq=hq, hkv=hkv, batch=batch, keys=n, page=page)
        if time.time() - out.t0 > budget_s:
            out.row(**base, impl="*", status="budget", error=f"{len(todo) - i} points not started (--budget-s)")
            break
        w = workload(hq, hkv, batch, n, page, cfg.head_dim)
        floor = floor_time_us(w, dev.roofline_gbps, dev.roofline_tflops)
        read = w.kv_bytes
        nsets = rotations(read, torch.cuda.get_device_properties(0).L2_cache_size) if on_gpu else 1
        sets = [gqa_inputs(batch, hq, hkv, cfg.head_dim, n, page_size=page, dtype=dtype, device=device, seed=s,
                           draw_on="device" if on_gpu else "cpu") for s in range(nsets)]
        lens = [n] * batch
        for c in ("k_cache", "v_cache"):  # set 0, the checked one: NaN where no request reads
            poison_unread_pages_(sets[0][c], sets[0]["block_table"], lens, page)
        ref, ref_lse = reference.gqa_decode(**sets[0], return_lse=True)
        counters = [torch.zeros(batch, hkv, dtype=torch.int32, device=device) for _ in sets]
        impls = [t for t in splitlab_impls(sets[0], w, dev) if only is None or t[0] in ("shipped", only)]
        for impl, sched, splits, ctas, make in impls:
            row = dict(base, impl=impl, schedule=sched, splits=splits, ctas=ctas, sets=nsets)
            try:
                with poisoned_allocs():
                    o, lse = make(sets[0], counters[0])()
                err, lerr, status, why = verdict(o, lse, ref, ref_lse, dtype, counters[0])
                if status == "ok" and on_gpu:
                    t = time_graph([make(x, c) for x, c in zip(sets, counters, strict=True)], replays=20)
                    out.row(**row, us=t.p50_us, p20_us=t.p20_us, p80_us=t.p80_us, roofline=floor / t.p50_us,
                            rel_err=err, lse_err=lerr, status="ok")
                else:  # wrong, or ok on the CPU (checked, never timed)
                    out.row(**row, rel_err=err, lse_err=lerr, status="checked" if status == "ok" else status,
                            error=why)
            except Exception as e:  # a launch that fails: recorded, not timed
                out.row(**row, status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        del sets
        for peer in PEERS if only is None else ():
            row = dict(base, impl=peer, schedule="dense")
            if not on_gpu:
                out.row(**row, status="unavailable", error="no GPU (dry run)")
                continue
            try:
                ins = [contiguous_kv(batch, hq, hkv, cfg.head_dim, n, seed=s) for s in range(nsets)]
                calls = [sdpa(peer.split("-")[1], *x) for x in ins]
                err, _, status, why = verdict(calls[0]()[:, :, 0], None, dense_reference(*ins[0]), None, dtype)
                if status == "ok":
                    t = time_graph(calls, replays=20)
                    out.row(**row, sets=nsets, us=t.p50_us, p20_us=t.p20_us, p80_us=t.p80_us,
                            roofline=floor / t.p50_us, rel_err=err, status="ok")
                else:
                    out.row(**row, sets=nsets, rel_err=err, status=status, error=why)
                del ins, calls
            except Exception as e:  # the backend refused the shape
                out.row(**row, status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        if on_gpu:
            torch.cuda.empty_cache()
    out.f.close()
    return path


def summary(path: Path) -> str:
    """Per implementation (and schedule), cuDNN's time over its time and over the best SDPA's: geomean and worst over
    the points both timed; then the variants over ``wl-plain`` on the same schedule; then the worst points."""
    import pandas as pd

    d = pd.read_csv(path)
    lines = [f"{len(d)} rows; status: " + ", ".join(f"{k} {v}" for k, v in d.status.value_counts().items())]
    t = d[(d.status == "ok") & d.us.notna()]
    if t.empty:
        lines.append("no timed rows (a dry run, or nothing passed its check)")
        return "\n".join(lines)
    key = ["hq", "hkv", "batch", "keys", "page"]
    peers = t[t.impl.isin(PEERS)].groupby(key[:-1])
    # SDPA reads a contiguous cache: its rows repeat at each page size, the same shape; its best time stands
    cudnn = t[t.impl == "sdpa-cudnn"].groupby(key[:-1]).us.min()
    best_peer = peers.us.min()
    ours = t[~t.impl.isin(PEERS)]
    rows = []
    for (impl, sched, page), g in ours.groupby(["impl", "schedule", "page"]):
        g = g.set_index(key[:-1])
        vs_c = (cudnn.reindex(g.index) / g.us).dropna()
        vs_b = (best_peer.reindex(g.index) / g.us).dropna()
        plain = ours[(ours.impl == "wl-plain") & (ours.schedule == sched) & (ours.page == page)].set_index(key[:-1])
        vs_p = (plain.us.reindex(g.index) / g.us).dropna()
        rows.append(dict(impl=impl, schedule=sched, page=page, points=len(g),
                         cudnn_geo=_geo(vs_c), cudnn_worst=vs_c.min(), best_sdpa_geo=_geo(vs_b),
                         best_sdpa_worst=vs_b.min(), plain_geo=_geo(vs_p), roofline=g.roofline.mean()))
    lines.append("speed = peer's (or wl-plain's) time over this time; >1 faster (measured, same run)")
    lines.append(pd.DataFrame(rows).round(3).to_string(index=False))
    short = ours[ours["keys"] == ours["keys"].min()].sort_values("us").groupby(["hq", "batch", "page"]).head(1)
    lines.append("fastest splitlab implementation per (heads, batch, page) at the shortest keys:")
    lines.append(short[["hq", "hkv", "batch", "page", "impl", "schedule", "splits", "us", "roofline"]]
                 .round(3).to_string(index=False))
    return "\n".join(lines)


def _geo(s) -> float:
    return float(math.exp(sum(math.log(v) for v in s) / len(s))) if len(s) else math.nan


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="experiments/short_launch/ab.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="check then time every point (one H200), or --dry-run on the CPU")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=210.0, help="no point starts after this many seconds")
    r.add_argument("--dry-run", action="store_true", help="tiny shapes under Triton's interpreter, checks only")
    s = sub.add_parser("summary", help="the reading of a CSV (no GPU)")
    s.add_argument("csv", type=Path)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.cmd == "summary":
        print(summary(a.csv))
        return 0
    if a.dry_run:  # before any splitlab.kernels import: Triton picks the interpreter when @triton.jit runs
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: a timed run needs the GPU (or pass --dry-run)")
    print(run(a.out, DRY if a.dry_run else GPU, a.budget_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
