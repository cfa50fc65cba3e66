"""The serving loop timed (issue 36 item 4): L layers x S decode steps of a simulated server, each step one CUDA
graph replay, splitlab (the schedule planned on the host, and on the device inside the graph) against FlashInfer's
plan/run (GQA) and FlashMLA and FlashInfer fa3 (MLA), every step's output checked against fp64 before it is timed.

    python experiments/serving_loop/bench.py --out OUT --fmla KIT
    TRITON_INTERPRET=1 python experiments/serving_loop/bench.py --interpret --out OUT   # the CPU: splitlab, untimed

The loop is ``examples/serving_loop.py``'s (its ``Cache`` and ``Bucket``): a closed-loop server (``--arrival full``:
every slot live, so each step is one batch bucket of ``--slots`` requests, which FlashInfer's graph mode needs: a
request of no keys has no page) whose lengths come from ``splitlab.serving`` (``--profile``). Every implementation
decodes the same steps: the same lengths, block table, queries and caches. Per step and implementation: its host work
for the step (``plan(lens)``: splitlab's host plan, FlashInfer's ``plan()``; none for splitlab's device plan and
FlashMLA, whose schedules run inside the graph), wall time in ``host_us``; one replay, NaN-poisoned outputs, every
layer checked against fp64 (``rel_err``, ``ok``); then ``--replays`` replays between CUDA events, ``gpu_us`` per replay
(a step: L layers, the device schedule included). A wrong step is not timed.

Writes OUT/serving_loop.csv (a row per shape, profile, step and implementation) and OUT/summary.csv (per shape,
profile and implementation: the geomean step time and the geomean over steps of the best peer's step time over
its own, ``vs_best_peer``: above 1 is faster than every peer).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import torch

from splitlab import serving
from splitlab.bench import peers_flashinfer, peers_flashmla
from splitlab.bench.csvrows import write_rows
from splitlab.bench.peers import gpu_missing, library_missing
from splitlab.kernels.accuracy import TOLERANCE, rel_err
from splitlab.workloads import DecodeWorkload

REPO = Path(__file__).resolve().parents[2]
#: -pdl: the plans' pdl=True; -splitlab: splitlab's scheduler computed on the device (the others there: balanced)
SPLITLAB = ("splitlab-device", "splitlab-host", "splitlab-device-pdl", "splitlab-device-splitlab")
PEERS = {"gqa": ("flashinfer",), "mla": ("flashmla", "flashinfer-fa3")}


def example():
    """examples/serving_loop.py as a module (the loop this script times)."""
    spec = importlib.util.spec_from_file_location("serving_loop", REPO / "examples" / "serving_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class Graphed:
    """An implementation of one step: ``prepare(lens)`` its host work, ``forward()`` the step's kernels (what its
    graph holds; returns the L outputs), captured at the first ``replay()``."""

    def __init__(self, name: str, cuda: bool) -> None:
        self.name, self.cuda, self.graph, self.outs = name, cuda, None, None

    def prepare(self, lens: list[int]) -> None:
        pass

    def forward(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def replay(self) -> list[torch.Tensor]:
        if self.outs is not None:
            for o in self.outs:
                o.fill_(math.nan)  # a row the step leaves unwritten fails the check
        if not self.cuda:
            self.outs = self.forward()
            return self.outs
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self.warm()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outs = self.forward()
            for o in self.outs:
                o.fill_(math.nan)
        self.graph.replay()
        return self.outs

    def warm(self) -> None:
        self.forward()


class Splitlab(Graphed):
    """splitlab's plan/run: the example's ``Bucket`` (its plan, its graph's step), reading ``src``'s inputs."""

    def __init__(self, name: str, loop, c, cache, src, device, dtype) -> None:
        super().__init__(name, device.type == "cuda")
        plan = "device" if name.startswith("splitlab-device") else "host"
        pdl = name.endswith("-pdl")
        scheduler = "splitlab" if name.endswith("-splitlab") else c.scheduler
        same = src.c.plan == plan and src.c.pdl == pdl and src.c.scheduler == scheduler
        self.bucket = src if same else loop.Bucket(
            loop.Config(**{**c.__dict__, "plan": plan, "pdl": pdl, "scheduler": scheduler}), cache, src.size, device,
            dtype)
        b = self.bucket
        b.lens, b.table, b.q = src.lens, src.table, src.q  # the same inputs (the graph holds their addresses)
        self.host = plan == "host"

    def prepare(self, lens: list[int]) -> None:
        if self.host:
            self.bucket.plan.plan(lens)

    def forward(self) -> list[torch.Tensor]:
        self.bucket.forward()
        return list(self.bucket.out)


class FlashInfer(Graphed):
    """FlashInfer's graph-mode wrapper (``peers_flashinfer``), planned on the host each step, run for every layer."""

    def __init__(self, name: str, c, cache, src) -> None:
        super().__init__(name, True)
        self.c, self.cache, self.src = c, cache, src
        pages = cache.table.numel()
        dev = src.q.device
        self.wrapper = (peers_flashinfer.graph_decode_wrapper(src.size, pages, dev) if c.kind == "gqa" else
                        peers_flashinfer.graph_mla_wrapper(src.size, pages, "fa3", dev))
        self.out = torch.empty(c.layers, src.size, cache.hq, cache.dv, dtype=src.q.dtype, device=dev)

    def prepare(self, lens: list[int]) -> None:
        c, cache, src = self.c, self.cache, self.src
        w = DecodeWorkload(c.kind, src.size, cache.hq, cache.hkv, cache.dqk, cache.dv, max(lens),
                           page_size=cache.page, seq_lens=tuple(lens))
        x = dict(q=src.q[0], block_table=src.table, seq_lens=src.lens)
        if c.kind == "gqa":
            peers_flashinfer.plan_decode(self.wrapper, w, {**x, "k_cache": cache.k[0]})
        else:
            peers_flashinfer.plan_mla(self.wrapper, w, {**x, "kv_cache": cache.k[0]})

    def forward(self) -> list[torch.Tensor]:
        for layer in range(self.c.layers):
            q, out = self.src.q[layer], self.out[layer]
            if self.c.kind == "gqa":
                self.wrapper.run(q, (self.cache.k[layer], self.cache.v[layer]), out=out)
            else:
                self.wrapper.run(query=q, kv_cache=self.cache.k[layer], out=out)
        return list(self.out)


class FlashMLA(Graphed):
    """FlashMLA (``peers_flashmla.decode``), its schedule (``get_mla_metadata``) a fresh one at capture: computed by
    the first layer's call inside the graph, so every replay recomputes it from the lengths, then reused by the
    other layers."""

    def __init__(self, name: str, c, cache, src) -> None:
        super().__init__(name, True)
        self.c, self.cache, self.src = c, cache, src

    def forward(self) -> list[torch.Tensor]:
        import flash_mla

        sched = flash_mla.get_mla_metadata()[0]
        return [peers_flashmla.decode(self.src.q[layer], self.cache.k[layer], self.src.table, self.src.lens, sched)
                for layer in range(self.c.layers)]


def peer_missing(name: str) -> str | None:
    lib = peers_flashmla.LIBRARY if name == "flashmla" else peers_flashinfer.LIBRARY
    return library_missing(lib, name, "see splitlab/bench/peers_*.py") or gpu_missing(name)


def gpu_us(impl: Graphed, replays: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        impl.graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / replays * 1e3


def run_loop(loop, c, impl_names: list[str], replays: int, label: dict) -> list[dict]:
    """S steps of the loop for every implementation in ``impl_names``; a row per step and implementation."""
    device = torch.device("cpu" if c.interpret else "cuda")
    dtype = torch.float32 if c.interpret else torch.bfloat16
    tol = TOLERANCE[dtype]
    cache = loop.Cache(c, device, dtype)
    src = loop.Bucket(c, cache, c.slots, device, dtype)
    impls: list[Graphed] = []
    for name in impl_names:
        if name in SPLITLAB:
            impls.append(Splitlab(name, loop, c, cache, src, device, dtype))
        elif name == "flashmla":
            impls.append(FlashMLA(name, c, cache, src))
        else:
            impls.append(FlashInfer(name, c, cache, src))
    server = serving.Server(c.profile, c.slots, seed=c.seed, arrival="full", scale=c.scale, max_len=c.max_len)
    g = torch.Generator(device=device).manual_seed(c.seed + 1)
    rows = []
    for t in range(c.steps):
        lens = list(server.step())
        src.load(list(range(c.slots)), lens, g)
        refs = [cache.reference(layer, src.q[layer], src.table, src.lens) for layer in range(c.layers)]
        for impl in impls:
            t0 = time.perf_counter()
            impl.prepare(lens)
            host = (time.perf_counter() - t0) * 1e6
            outs = impl.replay()
            errs = [rel_err(o, r) for o, r in zip(outs, refs, strict=True)]
            ok = all(e <= tol for e in errs)
            row = dict(**label, step=t, impl=impl.name, live=sum(n > 0 for n in lens), longest=max(lens),
                       keys=sum(lens), rel_err=f"{max(errs):.2e}", ok=ok, host_us="", gpu_us="")
            if impl.cuda:  # on the CPU nothing is timed (the interpreter's wall time is no measurement)
                row["host_us"] = round(host, 1)
            if ok and impl.cuda:
                row["gpu_us"] = round(gpu_us(impl, replays), 2)
            rows.append(row)
            print(row, flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per (kind, slots, profile, impl): steps timed, wrong steps, the geomean step time, and the geomean over steps
    of (the best peer's step time / this implementation's)."""
    out = []
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    wrong: dict[tuple, int] = {}
    for r in rows:
        key = (r["kind"], r["slots"], r["profile"])
        if r["gpu_us"] != "":
            groups.setdefault(key, {}).setdefault(r["impl"], {})[r["step"]] = float(r["gpu_us"])
        wrong[key + (r["impl"],)] = wrong.get(key + (r["impl"],), 0) + (not r["ok"])
    for key, by_impl in groups.items():
        peers = [n for n in by_impl if n not in SPLITLAB]
        for name, times in by_impl.items():
            row = dict(zip(("kind", "slots", "profile"), key, strict=True), impl=name, steps=len(times),
                       wrong=wrong[key + (name,)], geomean_us=round(_geomean(times.values()), 2), vs_best_peer="")
            ratios = [min(by_impl[p][t] for p in peers) / us for t, us in times.items()
                      if all(t in by_impl[p] for p in peers)] if peers else []
            if ratios:
                row["vs_best_peer"] = round(_geomean(ratios), 4)
            out.append(row)
    return out


def _geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="gqa,mla")
    ap.add_argument("--slots", default="16,64", help="batch buckets (comma-separated)")
    ap.add_argument("--profiles", default="chat,code")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fmla", default="", help="the FlashMLA kit's folder (built and imported; none: not run)")
    ap.add_argument("--interpret", action="store_true", help="the CPU (TRITON_INTERPRET=1): splitlab only, tiny, "
                                                             "untimed")
    a = ap.parse_args(argv)
    loop = example()
    if a.fmla and not a.interpret:
        from splitlab.bench.peers_flashmla import load_kit

        load_kit(a.fmla)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in a.kinds.split(","):
        names = list(SPLITLAB)
        if not a.interpret:
            for peer in PEERS[kind]:
                why = peer_missing(peer)
                if why:
                    print(f"{peer}: not run ({why})", flush=True)
                else:
                    names.append(peer)
        for slots in [int(s) for s in a.slots.split(",")]:
            for profile in a.profiles.split(","):
                argv_c = ["--kind", kind, "--slots", str(slots), "--profile", profile, "--seed", str(a.seed)]
                argv_c += ["--steps", str(a.steps)] if a.steps else []
                argv_c += ["--layers", str(a.layers)] if a.layers else []
                c = loop.parse(argv_c + (["--interpret"] if a.interpret else []))
                label = dict(kind=kind, slots=slots, profile=profile, layers=c.layers)
                rows += run_loop(loop, c, names, a.replays, label)
    write_rows(out / "serving_loop.csv", rows)
    summary = summarize(rows)
    if summary:
        write_rows(out / "summary.csv", summary)
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows)} steps x implementations, {bad} outside the fp64 tolerance", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
