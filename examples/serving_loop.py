"""A decode serving loop on splitlab's plan/run API: L layers x S steps of a continuous-batching server.

Each step the server (``splitlab.serving``: requests arrive, grow one key per generated token, leave) gives every
slot's KV length. The live requests are packed into the smallest batch bucket that holds them (padded slots: length
0), and that bucket's CUDA graph is replayed: captured once per bucket, at its first step, holding the whole step
(``plan_on_device`` then ``run`` for every layer, with ``device_schedule=True``: the schedule is recomputed on the GPU
from the lengths each replay; or, ``--plan host``, ``plan(lens)`` on the host each step and the graph holding the
layers' ``run`` calls). Every step's output, every layer, is checked against the fp64 reference.

    python examples/serving_loop.py                              # a GPU: Llama-3-8B's attention, graphs
    python examples/serving_loop.py --kind mla --plan host       # DeepSeek-V3 MLA at TP8 (16 heads)
    TRITON_INTERPRET=1 python examples/serving_loop.py --interpret   # the CPU: tiny shapes, no graphs

The KV caches are random (nothing here runs a model): each slot owns ``--max-len`` keys of pages of every layer's
cache, and a request in a slot attends the first ``length`` of them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import torch

from splitlab import serving
from splitlab.intmath import cdiv
from splitlab.kernels import reference
from splitlab.kernels.accuracy import TOLERANCE, rel_err
from splitlab.kernels.decode_plan import GQADecodePlan, MLADecodePlan

#: Attention shapes: (query heads, kv heads, head dim qk, head dim v, page size), the GPU's and the interpreter's.
SHAPES = {"gqa": (32, 8, 128, 128, 16), "mla": (16, 1, 576, 512, 64)}  # Llama-3-8B; DeepSeek-V3 MLA at TP8
TINY = {"gqa": (4, 2, 32, 32, 16), "mla": (16, 1, 96, 64, 64)}


@dataclass
class Config:
    kind: str = "gqa"
    plan: str = "device"  # device: plan_on_device inside the graph; host: plan(lens) before each replay
    scheduler: str | None = None  # default: balanced on the device, splitlab on the host
    pdl: bool = False  # the plans' merge by programmatic dependent launch (decode_plan's pdl)
    layers: int = 4
    steps: int = 64
    slots: int = 64
    profile: str = "chat"
    arrival: str = "full"
    rate: float | None = None
    scale: float = 1.0
    max_len: int = 16384
    seed: int = 0
    interpret: bool = False  # tiny shapes, float32, no graphs (the CPU)


class Cache:
    """The KV caches of ``layers`` layers; slot ``b`` owns row ``b`` of ``table`` (its pages, shuffled)."""

    def __init__(self, c: Config, device: torch.device, dtype: torch.dtype) -> None:
        hq, hkv, dqk, dv, page = (TINY if c.interpret else SHAPES)[c.kind]
        self.kind, self.hq, self.dqk, self.dv, self.page = c.kind, hq, dqk, dv, page
        pages = cdiv(c.max_len, page)
        g = torch.Generator(device="cpu").manual_seed(c.seed)
        self.table = torch.randperm(c.slots * pages, generator=g).to(torch.int32).view(c.slots, pages).to(device)
        shape = (c.layers, c.slots * pages, page) + ((hkv, dqk) if c.kind == "gqa" else (dqk,))
        gd = torch.Generator(device=device).manual_seed(c.seed)
        self.k = torch.randn(shape, generator=gd, device=device).to(dtype)  # GQA's K, MLA's latent (K and V)
        self.v = torch.randn(shape, generator=gd, device=device).to(dtype) if c.kind == "gqa" else None
        self.hkv = hkv

    def plan(self, c: Config, batch: int, device: torch.device, dtype: torch.dtype):
        sched = c.scheduler or ("balanced" if c.plan == "device" else "splitlab")
        kw = dict(dtype=dtype, device=device, scheduler=sched, max_batch=batch, use_cuda_graph=True,
                  device_schedule=c.plan == "device", pdl=c.pdl)
        if self.kind == "gqa":
            return GQADecodePlan(self.hq, self.hkv, self.dqk, self.page, **kw)
        return MLADecodePlan(self.hq, self.dqk, self.dv, self.page, **kw)

    def run(self, plan, layer: int, q, table, out) -> None:
        if self.kind == "gqa":
            plan.run(q, self.k[layer], self.v[layer], table, out=out, check=False)
        else:
            plan.run(q, self.k[layer], table, out=out, check=False)

    def reference(self, layer: int, q, table, lens):
        if self.kind == "gqa":
            return reference.gqa_decode(q, self.k[layer], self.v[layer], table, lens)
        return reference.mla_decode(q, self.k[layer], table, lens, head_dim_v=self.dv)


class Bucket:
    """One batch size: a plan, static inputs and outputs (a graph holds their addresses), and the graph."""

    def __init__(self, c: Config, cache: Cache, size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.c, self.cache, self.size, self.device = c, cache, size, device
        self.plan = cache.plan(c, size, device, dtype)
        self.lens = torch.zeros(size, dtype=torch.int32, device=device)
        self.table = cache.table[:1].repeat(size, 1)
        self.q = torch.empty(c.layers, size, cache.hq, cache.dqk, dtype=dtype, device=device)
        self.out = torch.empty(c.layers, size, cache.hq, cache.dv, dtype=dtype, device=device)
        self.graph = None

    def forward(self) -> None:
        """One decode step of every layer: what the graph holds."""
        if self.c.plan == "device":
            self.plan.plan_on_device(self.lens)  # the schedule, on the GPU, from the lengths the tensor holds now
        for layer in range(self.c.layers):
            self.cache.run(self.plan, layer, self.q[layer], self.table, self.out[layer])

    def load(self, slots: list[int], lens: list[int], g: torch.Generator) -> list[int]:
        """The step's requests into the static inputs: their lengths (padded with 0), their slots' table rows,
        fresh queries; returns the padded lengths."""
        padded = lens + [0] * (self.size - len(lens))
        self.lens.copy_(torch.tensor(padded, dtype=torch.int32))
        self.table[:len(slots)] = self.cache.table[slots]
        self.q.copy_(torch.randn(self.q.shape, generator=g, device=self.device))
        if self.c.plan == "host":
            self.plan.plan(padded)  # host lengths, as a server's scheduler has them
        return padded

    def replay(self) -> None:
        self.out.fill_(math.nan)  # a row the step leaves unwritten fails the check
        if self.device.type != "cuda":
            self.forward()
            return
        if self.graph is None:  # capture once per bucket: warm up on a side stream, then record
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self.forward()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.forward()
        self.graph.replay()

    def errors(self) -> list[float]:
        """Each layer's relative error against the fp64 reference."""
        return [rel_err(self.out[layer], self.cache.reference(layer, self.q[layer], self.table, self.lens))
                for layer in range(self.c.layers)]


def buckets_for(slots: int) -> list[int]:
    """Batch buckets: powers of two below ``slots``, and ``slots``."""
    return sorted({1 << k for k in range(slots.bit_length()) if 1 << k < slots} | {slots})


def serve(c: Config, *, device: torch.device | None = None, on_step=None) -> dict:
    """Run the loop; returns a summary (steps, failures, the largest error, the buckets captured). ``on_step(t,
    bucket)``, if given, is called after each step's replay (what a benchmark times)."""
    device = device or torch.device("cpu" if c.interpret or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if c.interpret else torch.bfloat16
    tol = TOLERANCE[dtype]
    cache = Cache(c, device, dtype)
    server = serving.Server(c.profile, c.slots, seed=c.seed, arrival=c.arrival, rate=c.rate, scale=c.scale,
                            max_len=c.max_len)
    sizes, buckets = buckets_for(c.slots), {}
    g = torch.Generator(device=device).manual_seed(c.seed + 1)
    failures, worst, empty = 0, 0.0, 0
    for t in range(c.steps):
        lens = server.step()
        live = [b for b, n in enumerate(lens) if n > 0]
        if not live:
            empty += 1  # nothing to decode this step
            continue
        size = next(s for s in sizes if s >= len(live))
        if size not in buckets:
            buckets[size] = Bucket(c, cache, size, device, dtype)
        bucket = buckets[size]
        bucket.load(live, [lens[b] for b in live], g)
        bucket.replay()
        if on_step is not None:
            on_step(t, bucket)
        errs = bucket.errors()
        bad = sum(not e <= tol for e in errs)
        failures += bad
        worst = max([worst, *errs])
        print(f"step {t:4d}: {len(live):4d} live in bucket {size:4d}, longest {max(lens):6d}, rel err "
              f"{max(errs):.2e}{'  FAIL' if bad else ''}", flush=True)
    return dict(steps=c.steps, empty_steps=empty, failures=failures, worst=worst, tolerance=tol,
                buckets=sorted(buckets), graphs=sum(b.graph is not None for b in buckets.values()))


def parse(argv: list[str] | None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("gqa", "mla"), default="gqa")
    ap.add_argument("--plan", choices=("device", "host"), default="device")
    ap.add_argument("--scheduler", default=None, help="a planners.schedulers name (device: balanced, stream_k)")
    ap.add_argument("--pdl", action="store_true", help="the merge by programmatic dependent launch (a GPU's)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--slots", type=int)
    ap.add_argument("--profile", choices=list(serving.PROFILES), default="chat")
    ap.add_argument("--arrival", choices=serving.ARRIVALS, default="full")
    ap.add_argument("--rate", type=float, default=None, help="requests per step (--arrival poisson)")
    ap.add_argument("--scale", type=float, help="multiplies every request length (default 1; 0.02 interpreted)")
    ap.add_argument("--max-len", type=int, help="a slot's KV capacity in keys")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interpret", action="store_true", help="tiny shapes on the CPU (set TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    small = a.interpret  # the interpreter's defaults: a few slots, short requests
    defaults = dict(layers=2 if small else 4, steps=6 if small else 64, slots=4 if small else 64,
                    scale=0.02 if small else 1.0, max_len=96 if small else 16384)
    got = {k: getattr(a, k) for k in defaults}
    return Config(kind=a.kind, plan=a.plan, scheduler=a.scheduler, pdl=a.pdl, profile=a.profile, arrival=a.arrival,
                  rate=a.rate, seed=a.seed, interpret=a.interpret,
                  **{k: defaults[k] if v is None else v for k, v in got.items()})


def main(argv: list[str] | None = None) -> int:
    c = parse(argv)
    if c.interpret and os.environ.get("TRITON_INTERPRET") != "1":
        print("--interpret needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)")
        return 2
    s = serve(c)
    print(f"{s['steps']} steps x {c.layers} layers ({s['empty_steps']} with no request), buckets {s['buckets']} "
          f"({s['graphs']} CUDA graphs): {s['failures']} outputs past the fp64 tolerance {s['tolerance']:g}, "
          f"largest rel err {s['worst']:.2e}")
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
