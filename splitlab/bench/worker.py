"""Measuring one sweep point: check against the fp64 reference, then time; in a worker process, so that a point
that crashes or hangs costs that point only.

``Measurer`` does the work (in whichever process runs it): inputs and reference built once per shape, the
implementation's output compared with the reference (tolerance ``splitlab.kernels.accuracy.TOLERANCE`` of the
input dtype), a right point timed. A point that raises is an ``error`` row with the reason. A work-list point (one
with a schedule, ``bench.grid.Point.schedule``) has its work list put on the device once (``with_schedule``), shared by
the check and every timed call; the timer is told the schedule (``schedule=``) as well as the split count.

Timelines (``timelines=True``, ``splitlab sweep --timelines``). A work-list point that passed its check and was timed
is launched once more with its timeline on (``KernelImpl.timeline``; on a GPU after one warm-up launch of that build),
after the timing, so the timed calls are the plain build's; its records are ``Measurer.timeline`` (None for any other
point), which the worker sends with the row. An instrumented launch that raises makes the point an ``error`` row
naming it (its times kept).

``PointWorker`` runs a ``Measurer`` in one persistent child process per sweep session (a fresh interpreter, so
nothing of the parent's CUDA state is inherited; it keeps its CUDA context, Triton's in-memory kernel cache and
the current shape's inputs from point to point, so the common path costs one message each way). A point whose
worker dies (a segfault, an abort, ``os._exit``) is an ``error`` row "worker died with SIGSEGV"; one that runs
past ``timeout_s`` has its worker killed and is an ``error`` row "timed out after N s"; a sticky CUDA error
ends the worker after its row. Neither is retried. The next point starts a new worker (imports, CUDA context:
seconds). The worker ignores Ctrl-C and SIGTERM (its parent, the session, handles them and kills it) and, on
Linux, dies with its parent.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

#: In a worker's environment: its parent's pid (code under test can tell it runs in a worker).
WORKER_ENV = "SPLITLAB_POINT_WORKER"
#: Seconds a new worker may take to import and start (torch, Triton, the implementation).
START_TIMEOUT_S = 300.0
#: Seconds a worker asked to stop may take before it is killed.
STOP_TIMEOUT_S = 5.0
#: Default ``point_timeout_s``: generous for a GPU point (compiles, inputs, fp64 reference and the replays of the
#: largest shapes take well under a minute); raise it for Triton's interpreter on large shapes. Here, not in
#: ``sweep`` (which imports pandas), so that ``splitlab --help`` can show it cheaply.
POINT_TIMEOUT_S = 300.0


def message(e: BaseException) -> str:
    """``Type: first line`` of an exception (at most 300 characters of it), for a row's ``error``."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}".strip()


def stamp(row: dict, t0: float) -> None:
    """Record in ``row`` how long its point took (``elapsed_s``, since ``time.monotonic()`` was ``t0``) and when
    it finished."""
    row.update(elapsed_s=round(time.monotonic() - t0, 3), finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def cuda_broken() -> str | None:
    """The sticky CUDA error that makes the context unusable, if there is one."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as e:  # an illegal address or a launch failure poisons the context for good
        return message(e)
    return None


def empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Shape:
    """Inputs (and their rotated copies) and the reference output of one shape, built once (the reference on
    first use)."""

    def __init__(self, impl: Any, w: Any, device: str, seed: int) -> None:
        import torch

        from splitlab.kernels.accuracy import references

        self.inputs = impl.inputs(w, device=device, seed=seed)
        #: The reference output for a launch with head tile ``block_h`` (an fp8 cache's 64-row tiles compute
        #: with an fp8-rounded q: ``accuracy.reference_inputs``).
        self.ref_for = references(w, self.inputs, lambda x: impl.reference(w, x))
        self.set_bytes = sum(t.numel() * t.element_size() for t in self.inputs.values()
                             if isinstance(t, torch.Tensor))
        self.sets = [self.inputs]

    def input_sets(self, n: int) -> list[dict]:
        """``n`` input sets: the first and ``n - 1`` copies at other addresses (same values)."""
        import torch

        while len(self.sets) < n:
            self.sets.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.inputs.items()})
        return self.sets[:n]


class Measurer:
    """Check, then time, the points of one implementation with one timer (the current shape kept between
    points: a sweep is shape-major)."""

    def __init__(self, impl: Any, timer: Any, seed: int, timelines: bool = False) -> None:
        self.impl, self.timer, self.seed, self.timelines = impl, timer, seed, timelines
        #: The last point's timeline records (``KernelImpl.timeline``), None where it recorded none.
        self.timeline: dict | None = None
        self._key: Any = None
        self._shape: Shape | BaseException | None = None

    def drop_shape(self) -> None:
        self._shape, self._key = None, None

    def _shape_for(self, w: Any) -> Shape:
        if self._key != w:
            self._shape, self._key = None, w
            gc.collect()
            empty_cache()
            try:
                self._shape = Shape(self.impl, w, torch_device(), self.seed)
            except Exception as e:  # e.g. out of memory: every point of the shape gets this reason
                self._shape = e.with_traceback(None)  # keep no frame (and no half-built tensor) alive
        if isinstance(self._shape, BaseException):
            raise self._shape
        assert self._shape is not None
        return self._shape

    def measure(self, p: Any, skeleton: dict) -> tuple[dict, str | None]:
        """One point's row, and the sticky CUDA error if the context is gone (then this process is done)."""
        from splitlab.kernels.accuracy import TOLERANCE, rel_err
        from splitlab.kernels.inputs import query_dtype

        t0 = time.monotonic()
        row = dict(skeleton, timing=self.timer.name)
        fatal = None
        self.timeline = None
        reason = self.impl.unavailable()
        if reason is not None:
            row.update(status="skipped", error=reason)
        else:
            try:
                w = p.workload
                shape = self._shape_for(w)
                knobs, sched = p.knobs, getattr(p, "schedule", None)
                if sched is not None:  # the work list, built once for the point
                    knobs = self.impl.with_schedule(sched, p.knobs, torch_device())
                err = rel_err(self.impl.call(w, shape.inputs, knobs)(), shape.ref_for(p.facts.get("block_h")))
                tol = TOLERANCE[query_dtype(w.dtype)]
                row["rel_err"] = err
                if not err <= tol:
                    row.update(status="wrong", error=f"rel_err {err:.3g} > tolerance {tol:g} of {w.dtype}; not timed")
                else:
                    impl = self.impl

                    def calls(n: int) -> list:
                        return [impl.call(w, s, knobs) for s in shape.input_sets(n)]

                    t = self.timer.measure(calls, set_bytes=shape.set_bytes, workload=w,
                                           num_splits=p.facts.get("num_splits"),
                                           **({"schedule": sched} if sched is not None else {}))
                    row.update(status="ok", p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, n_samples=t.n_samples,
                               timing_detail=t.method, gbps=w.kv_bytes / (t.p50_us * 1e3) if t.p50_us > 0 else None)
                    if self.timelines and sched is not None and getattr(impl, "records_timelines", False):
                        try:
                            self.timeline = impl.timeline(w, shape.inputs, knobs, warm=torch_device() == "cuda")
                        except Exception as e:
                            raise RuntimeError(f"the instrumented launch (--timelines) failed: {message(e)}") from e
            except Exception as e:
                row.update(status="error", error=message(e))
                fatal = cuda_broken()
                if fatal is None:
                    empty_cache()
        stamp(row, t0)
        return row, fatal


def death(returncode: int | None) -> str:
    """How a worker ended, in words: "died with SIGSEGV", "exited with code 9"."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            return f"died with {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died with signal {-returncode}"
    return f"exited with code {returncode}"


class WorkerFailed(RuntimeError):
    """The worker could not be started (or died while starting); the message says why."""


class PointWorker:
    """A ``Measurer`` in a child process (see the module docstring): ``measure`` returns the point's row, an
    ``error`` row when the worker died or timed out on it; ``close`` ends the worker. ``timer`` is a timer
    name (the worker makes it: ``timing.make_timer``) or a picklable timer object; ``timeout_s`` None: no
    limit."""

    def __init__(self, impl: Any, timer: Any, device: Any, seed: int, timeout_s: float | None,
                 timelines: bool = False) -> None:
        self.payload = pickle.dumps((impl, timer, device, seed, timelines))
        self.timeout_s = timeout_s
        #: The last point's timeline records (``Measurer.timeline``), None where it recorded none.
        self.timeline: dict | None = None
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start a worker unless one is running; ``WorkerFailed`` if it cannot start."""
        if self.alive:
            return
        self.close()
        import splitlab

        mine, theirs = socket.socketpair()
        root = str(Path(splitlab.__file__).resolve().parents[1])
        env = dict(os.environ, **{WORKER_ENV: str(os.getpid())})
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from splitlab.bench.worker import main; main()", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        except OSError as e:
            mine.close()
            raise WorkerFailed(f"could not start a worker process ({message(e)})") from None
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.starts += 1
        try:
            self.conn.send((list(sys.path), self.payload))
            reply = self._wait(max(START_TIMEOUT_S, self.timeout_s or 0))
        except OSError:
            reply = None
        if reply is None or reply[0] != "ready":
            why = reply[1] if reply is not None and reply[0] == "failed" else f"the worker {death(self._reap())}"
            self.close(kill=True)
            raise WorkerFailed(f"the point worker could not start: {why}")

    def _wait(self, timeout: float | None) -> tuple | None:
        """The worker's next message, or None if it died or sent nothing within ``timeout`` seconds."""
        assert self.conn is not None
        return self._recv() if self.conn.poll(timeout) else None

    def _recv(self) -> tuple | None:
        """The message the worker has sent, or None if it died instead."""
        assert self.conn is not None
        try:
            return self.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            return None

    def _reap(self) -> int | None:
        """The exit status of a worker that has ended or is ending (None if it is still running)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None

    def measure(self, p: Any, skeleton: dict) -> dict:
        """The row of point ``p`` (``skeleton`` holds its columns that do not depend on running it)."""
        self.start()
        assert self.conn is not None and self.proc is not None
        self.timeline = None
        t0 = time.monotonic()
        try:
            self.conn.send(("point", p, skeleton))
        except OSError:
            pass  # it died already: the wait below says how
        if not self.conn.poll(self.timeout_s):
            self.close(kill=True)
            why = f"timed out after {self.timeout_s:g} s (the worker was killed); not retried"
        else:
            reply = self._recv()
            if reply is not None and reply[0] == "row":
                if reply[2]:  # a sticky CUDA error: the worker ends itself; the next point gets a new one
                    self.close()
                self.timeline = reply[3]
                return reply[1]
            why = f"worker {death(self._reap())} during this point; not retried"
            self.close(kill=True)
        row = dict(skeleton, status="error", error=why, timing=None)
        stamp(row, t0)
        return row

    def close(self, *, kill: bool = False) -> None:
        """End the worker: ask it to stop (``kill``: kill it at once, e.g. mid-point), then reap it."""
        if self.conn is not None:
            if not kill and self.alive:
                with contextlib.suppress(OSError):
                    self.conn.send(("stop",))
            with contextlib.suppress(OSError):
                self.conn.close()
            self.conn = None
        if self.proc is not None:
            if kill and self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def _die_with_parent() -> None:
    """On Linux, ask the kernel to SIGKILL this process when its parent dies (a killed session leaves no worker
    holding the GPU)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get(WORKER_ENV) or os.getppid()):  # the parent died before the call
        os._exit(1)


def main() -> None:
    """The worker process: ``python -c "from splitlab.bench.worker import main; main()" FD``."""
    import faulthandler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session handles Ctrl-C and SIGTERM, and kills us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    faulthandler.enable()  # a crash prints where it happened to stderr
    conn = Connection(int(sys.argv[1]))
    try:
        path, payload = conn.recv()
    except (EOFError, OSError):
        sys.exit(0)
    sys.path[:] = path  # the parent's: the implementation (and a test's timer) import from there
    try:
        impl, timer, device, seed, timelines = pickle.loads(payload)
        if isinstance(timer, str):
            from splitlab.bench.timing import make_timer

            timer = make_timer(timer, device)
        m = Measurer(impl, timer, seed, timelines)
    except Exception as e:
        conn.send(("failed", message(e)))
        sys.exit(1)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] != "point":
            break
        row, fatal = m.measure(msg[1], msg[2])
        conn.send(("row", row, fatal, m.timeline))
        if fatal:
            break
    conn.close()
