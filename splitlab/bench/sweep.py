"""The sweep runner behind ``splitlab sweep``: expand a card's grid, check every point against the fp64
reference, time the ones that are right, and write results as it goes.

Per point: the implementation runs once on the shape's inputs and is compared with the reference (computed
once per shape; tolerance ``splitlab.kernels.testing.TOLERANCE`` of the input dtype). A wrong point is
stored ``wrong`` and not timed; a point that raises (compile error, out of memory, launch failure) is
stored ``error`` with the reason and the sweep goes on; an implementation that cannot run here (a peer
without a GPU) gives ``skipped`` rows.

Durability. Each session appends to its own journal (``journal-<session>.jsonl``, one JSON object a line,
flushed and fsynced, the file locked while the session lives): a ``start`` marker before a point runs, its
``row`` after. A resumed sweep skips finished points; a point started in a journal whose session is gone
and never finished killed its process: it is written ``error`` ("process died during this point") and not
retried. A session stopped from outside (Ctrl-C, SIGTERM) marks the point in flight ``abandon``: it is
retried once, then written ``error``. ``results.parquet`` is rebuilt from all journals (deduplicated by
point_id) every ``refresh_every`` points and when the session ends, so a kill loses at most the point in
flight and a row is never duplicated.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from splitlab import devices, results
from splitlab.bench import grid as grid_mod
from splitlab.bench.cards import Card
from splitlab.bench.env import capture
from splitlab.bench.grid import Expansion, Point
from splitlab.bench.timing import FakeTimer, Timer, make_timer
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.workloads import DecodeWorkload

try:  # journals are locked while their session lives, so a resume can tell a dead session from a live one
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS: every other journal counts as dead
    fcntl = None  # type: ignore[assignment]

DIED = "process died during this point (killed, crashed or hung); not retried"
INTERRUPTED_TWICE = "interrupted from outside twice during this point; not retried"
#: Rough planning figures for --dry-run's estimate (seconds): per point (check, capture, replays, Python)
#: and per shape (inputs on the GPU, fp64 reference); compiles and very long kernels come on top.
EST_POINT_S, EST_SHAPE_S = 0.4, 1.0


class SweepAborted(SplitlabError):
    """The sweep stopped because the GPU context is unusable (a sticky CUDA error); resume in a new process."""


@dataclass
class SweepOptions:
    """How to run one sweep (the ``splitlab sweep`` flags)."""

    grid: str = "default"
    out: Path = Path("runs")
    timer: str | None = None  # graph | events | fake; None: the sweep's (on resume) or the card's
    resume: bool = False
    device: str | None = None  # a preset to plan for; None: the GPU torch sees, else the card's device
    limit: int | None = None  # at most this many points in this session
    max_minutes: float | None = None  # start no point after this many minutes
    shard: tuple[int, int] | None = None  # (index, count), 0-based: whole shapes dealt round-robin
    quiet: bool = False
    refresh_every: int = 50
    seed: int = 1
    argv: list[str] | None = None


@dataclass
class SweepResult:
    """What one session did."""

    sweep_dir: Path
    sweep_id: str
    session: str
    statuses: dict[str, int] = field(default_factory=dict)  # this session's rows by status
    done: int = 0  # points of the grid (this shard) finished, all sessions
    total: int = 0  # points of the grid (this shard)
    stopped: str = "finished"  # finished | limit | time | interrupted | aborted

    @property
    def left(self) -> int:
        return self.total - self.done


# --- small pieces -------------------------------------------------------------------------------------------

def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def sweep_device(card: Card, override: str | None = None) -> DeviceSpec:
    """The device a sweep plans for: ``override`` (a preset), else the GPU torch sees, else the card's."""
    if override:
        return devices.get(override)
    import torch

    return devices.detect() if torch.cuda.is_available() else devices.get(card.device)


def sweep_dir(card: Card, options: SweepOptions) -> Path:
    """``<out>/<card name>-<grid>``: where a sweep's sidecar, journals and results live."""
    return Path(options.out) / f"{card.name}-{options.grid}"


def _write_json_atomic(path: Path, data: dict, *, exclusive: bool = False) -> bool:
    """Write ``path`` whole or not at all; with ``exclusive``, only if it does not exist (False if it did)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    try:
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
            tmp = None  # type: ignore[assignment]
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    return True


def _is_live(journal: Path) -> bool:
    """True while the session that writes ``journal`` holds its lock (i.e. is alive)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(journal, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class Journal:
    """One session's append-only journal: every event one JSON line, written, flushed and fsynced before
    ``write`` returns; the file is locked for the session's lifetime."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(self, event: dict) -> None:
        line = memoryview((json.dumps(event, default=_json_default, separators=(",", ":")) + "\n").encode())
        # Ctrl-C / SIGTERM wait until the line is whole on disk (a signal mid-line would tear the journal).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            while line:
                line = line[os.write(self.fd, line):]
            os.fsync(self.fd)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def _json_default(o: object) -> object:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _message(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}".strip()


def _cuda_broken() -> str | None:
    """The sticky CUDA error that makes the context unusable, if there is one."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as e:  # an illegal address or a launch failure poisons the context for good
        return _message(e)
    return None


class _Shape:
    """Inputs (and their rotated copies) and the reference output of one shape, built once (the reference on
    first use)."""

    def __init__(self, card: Card, w: DecodeWorkload, device: str, seed: int) -> None:
        import torch

        from splitlab.kernels.testing import references

        self.inputs = card.impl.inputs(w, device=device, seed=seed)
        #: The reference output for a launch with head tile ``block_h`` (an fp8 cache's 64-row tiles compute
        #: with an fp8-rounded q: ``testing.reference_inputs``).
        self.ref_for = references(w, self.inputs, lambda x: card.impl.reference(w, x))
        self.set_bytes = sum(t.numel() * t.element_size() for t in self.inputs.values()
                             if isinstance(t, torch.Tensor))
        self.sets = [self.inputs]

    def input_sets(self, n: int) -> list[dict]:
        """``n`` input sets: the first and ``n - 1`` copies at other addresses (same values)."""
        import torch

        while len(self.sets) < n:
            self.sets.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.inputs.items()})
        return self.sets[:n]


# --- the runner ---------------------------------------------------------------------------------------------

class Runner:
    """One session of one sweep (see the module docstring). ``timer`` overrides ``options.timer`` (tests)."""

    def __init__(self, card: Card, options: SweepOptions, *, timer: Timer | None = None) -> None:
        self.card, self.opts = card, options
        self.device = sweep_device(card, options.device)
        self.dir = sweep_dir(card, options)
        self._timer = timer
        self._shape_key: DecodeWorkload | None = None
        self._shape: _Shape | BaseException | None = None

    # -- planning ----------------------------------------------------------------------------------------
    def expansion(self) -> Expansion:
        return grid_mod.expand(self.card, self.opts.grid, self.device)

    def my_points(self, exp: Expansion) -> list[Point]:
        if self.opts.shard is None:
            return exp.points
        i, n = self.opts.shard
        return grid_mod.shard(exp.points, i, n)

    def sidecar(self) -> dict | None:
        p = self.dir / "sweep.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def describe(self, *, rows: int = 8) -> str:
        """The ``--dry-run`` text: what the sweep would run, and how far an existing one got."""
        exp = self.expansion()
        pts = self.my_points(exp)
        c = exp.counts()
        lines = [f"card {self.card.path} (kernel {self.card.name}, impl {self.card.impl_label}), grid "
                 f"{self.opts.grid}, planned for {self.device.name} ({self.device.sm_count} SMs)",
                 f"{c['points']} points over {c['shapes']} shapes: {c['grid_points']} from the grid, "
                 f"{c['planner_only_points']} only from planners"
                 + (f"; shard {self.opts.shard[0]}/{self.opts.shard[1]}: {len(pts)} points" if self.opts.shard else "")]
        per = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in c.items() if k.startswith("planner:"))
        if per:
            lines.append(f"points chosen per planner: {per}")
        if exp.notes:
            lines.append(f"{len(exp.notes)} planner notes (a planner refused a shape, or chose a knob outside the "
                         "card's range); they go to sweep.json")
        side = self.sidecar()
        if side is not None:
            done = results.sweep_state(self.dir).finished
            left = sum(p.point_id not in done for p in pts)
            lines.append(f"{self.dir} exists (sweep {side['sweep_id']}): {len(pts) - left} done, {left} left "
                         "(--resume continues it)")
        else:
            lines.append(f"would write {self.dir}")
        lines.append(f"rough GPU time: {self.estimate_minutes(pts):.0f} min ({EST_POINT_S} s a point, "
                     f"{EST_SHAPE_S} s a shape, plus the modelled kernel time of the replays; compiles not counted)")
        cols = ["batch", "num_q_heads", "ctx_len", "topk", "num_splits", "block_n", "block_k", "block_h",
                "num_warps", "num_stages", "ctas", "planners"]
        table = [p.row(sm_count=self.device.sm_count) for p in pts[:rows]]
        if table:
            cols = [k for k in cols if any(r.get(k) not in (None, "", 0) for r in table) or k == "planners"]
            cells = [[str(r.get(k) if r.get(k) is not None else "") for k in cols] for r in table]
            width = [max(len(k), *(len(x[i]) for x in cells)) for i, k in enumerate(cols)]
            lines.append("  ".join(k.rjust(wd) for k, wd in zip(cols, width, strict=True)))
            lines += ["  ".join(v.rjust(wd) for v, wd in zip(x, width, strict=True)) for x in cells]
            if len(pts) > rows:
                lines.append(f"... and {len(pts) - rows} more")
        return "\n".join(lines)

    def estimate_minutes(self, pts: list[Point]) -> float:
        """A rough GPU-time estimate for ``pts`` (see ``EST_POINT_S``): planning figure, not a promise."""
        from splitlab.bench.timing import rotations

        fake = FakeTimer(self.device)
        shapes = {p.workload for p in pts}
        s = EST_POINT_S * len(pts) + EST_SHAPE_S * len(shapes)
        l2 = int(self.device.l2_mb * 2**20)
        for p in pts:
            n = rotations(p.workload.kv_bytes, l2)
            s += 36 * n * fake.modelled_us(p.workload, p.facts.get("num_splits")) * 1e-6
        return s / 60

    # -- running ------------------------------------------------------------------------------------------
    def _make_timer(self, name: str) -> Timer:
        if self._timer is not None:
            return self._timer
        if name != "fake":
            import torch

            if not torch.cuda.is_available():
                raise SplitlabError(f"timer={name!r} needs a CUDA GPU; torch sees none (timer='fake' runs the "
                                    "harness on the CPU with modelled times that are not measurements)")
        return make_timer(name, self.device)

    def _timer_name(self) -> str:
        """The timer of this session: --timer, else the resumed sweep's, else the card's; refuses --resume
        of a sweep started with another timer, and an existing sweep without --resume."""
        side = self.sidecar()
        if side is not None and not self.opts.resume:
            raise SplitlabError(f"{self.dir} already holds sweep {side['sweep_id']}; pass --resume to continue it "
                                "(or choose another --out)")
        timer = self.opts.timer or (self._timer.name if self._timer is not None else None) \
            or (side or {}).get("timer") or self.card.timer
        if side is not None and side.get("timer") != timer:
            raise SplitlabError(f"timer={timer!r} is not allowed for {self.dir}; expected {side.get('timer')!r}, "
                                "the timer it was started with (one sweep, one timing method)")
        return timer

    def _open(self, exp: Expansion, env: dict, timer: str) -> dict:
        """Create the sweep folder and sidecar, or check an existing one (kernel, grid, device) for --resume."""
        side = self.sidecar()
        if side is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            new = dict(
                schema_version=results.SCHEMA_VERSION,
                sweep_id=f"{self.card.name}-{self.opts.grid}-{_utc_stamp()}-{secrets.token_hex(2)}",
                kernel=self.card.name, impl=self.card.impl_label, impl_import=self.card.impl_import,
                kind=self.card.kind, seeds=list(self.card.seeds), grid=self.opts.grid, timer=timer,
                card=dict(path=str(self.card.path), sha1=self.card.sha1, text=self.card.text),
                compare=list(self.card.compare), planner_knobs=list(self.card.planner_knobs),
                device=asdict(self.device), counts=exp.counts(), planner_notes=exp.notes,
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), env=env, sessions=[],
            )
            if not _write_json_atomic(self.dir / "sweep.json", new, exclusive=True):
                side = self.sidecar()  # another shard created it a moment ago
            else:
                side = new
        assert side is not None
        for key, mine in (("kernel", self.card.name), ("grid", self.opts.grid)):
            if side.get(key) != mine:
                raise SplitlabError(f"{self.dir} holds a sweep of {key}={side.get(key)!r}; expected {mine!r}")
        theirs, mine = side.get("env", {}).get("device", {}).get("name"), env["device"]["name"]
        if theirs != mine:
            raise SplitlabError(f"{self.dir} was measured on {theirs!r}; this machine has {mine!r} (start a new "
                                "sweep with another --out)")
        if side.get("card", {}).get("sha1") != self.card.sha1:
            print(f"splitlab: warning: {self.card.path} changed since {self.dir} was started; finished points are "
                  "kept, the grid is expanded from the card as it is now", file=sys.stderr)
        return side

    def _live_conflict(self) -> None:
        for j in results.journals(self.dir):
            if not _is_live(j):
                continue
            for _ in range(20):  # a session that has just opened its journal writes its header next
                head = next((e for e in results.read_journal(j) if e.get("event") == "session"), {})
                if head:
                    break
                time.sleep(0.1)
            theirs = tuple(head["shard"]) if head.get("shard") else None
            mine = self.opts.shard
            if theirs is None or mine is None or theirs == mine or theirs[1] != mine[1]:
                raise SplitlabError(f"{self.dir} is being swept by a live session ({j.name}, pid "
                                    f"{head.get('env', {}).get('pid')}, shard {theirs}); expected no other session "
                                    "on the same points (use --shard i/n for parallel sessions)")

    def run(self) -> SweepResult:
        """Run (or resume) the sweep; returns what this session did. Raises ``SweepAborted`` after a sticky
        CUDA error (the point is stored; resume in a fresh process)."""
        exp = self.expansion()
        timer_name = self._timer_name()
        timer = self._make_timer(timer_name)
        env = capture(self.opts.argv)
        side = self._open(exp, env, timer_name)
        self._live_conflict()
        session = f"{_utc_stamp()}-{os.getpid()}-{secrets.token_hex(2)}"
        journal = Journal(self.dir / f"journal-{session}.jsonl")
        res = SweepResult(self.dir, side["sweep_id"], session)
        self.sweep_id, self.session, self.timer = side["sweep_id"], session, timer
        base = dict(schema_version=results.SCHEMA_VERSION, sweep_id=side["sweep_id"], grid=self.opts.grid,
                    device=self.device.name, sm_count=self.device.sm_count, session=session, **_where(env))
        self.base = base
        self.blank = dict.fromkeys(results.COLUMNS)  # every row carries every column
        try:
            journal.write(dict(event="session", session=session, shard=self.opts.shard, timer=timer.name,
                               grid=self.opts.grid, card_sha1=self.card.sha1, env=env))
            self._loop(exp, journal, res)
        finally:
            journal.close()
            self._finish(res)
        return res

    def _settle_dead(self, st: results.SweepState, journal: Journal, res: SweepResult,
                     mine: set[str]) -> set[str]:
        """Write ``error`` rows for the points of ``mine`` (this session's shard: one live session per shard,
        so a point is settled once) whose session died on them (or that were interrupted twice). The row keeps
        where the point died (host, GPU)."""
        live = {j.name for j in results.journals(self.dir) if j.name != journal.path.name and _is_live(j)}
        finished, settled = st.finished, set()
        for pid, starts in st.starts.items():
            if pid in finished or pid not in mine or any(jn in live for jn, _ in starts):
                continue
            died = len(starts) - st.abandoned.get(pid, 0)
            reason = DIED if died > 0 else INTERRUPTED_TWICE if st.abandoned.get(pid, 0) >= 2 else None
            if reason is None:
                continue  # interrupted once from outside: retried
            where = {k: starts[-1][1][k] for k in WHERE if k in starts[-1][1]}
            row = {**starts[-1][1], **self.base, **where, "status": "error", "error": reason, "timing": None,
                   "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            journal.write(dict(event="row", row=row))
            res.statuses["error"] = res.statuses.get("error", 0) + 1
            settled.add(pid)
        return settled

    def _loop(self, exp: Expansion, journal: Journal, res: SweepResult) -> None:
        pts = self.my_points(exp)
        st = results.sweep_state(self.dir)
        done = st.finished | self._parquet_ids()
        done |= self._settle_dead(st, journal, res, {p.point_id for p in pts} - done)
        res.total = len(pts)
        pending = [p for p in pts if p.point_id not in done]
        res.done = res.total - len(pending)
        if not pending:
            return
        progress = _Progress(len(pending), quiet=self.opts.quiet, label=f"{self.card.name}/{self.opts.grid}")
        deadline = time.monotonic() + 60 * self.opts.max_minutes if self.opts.max_minutes else None
        ran = 0
        old = _install_sigterm()
        try:
            for p in pending:
                if self.opts.limit is not None and ran >= self.opts.limit:
                    res.stopped = "limit"
                    break
                if deadline is not None and ran and time.monotonic() > deadline:  # always make progress
                    res.stopped = "time"
                    break
                skeleton = {**self.blank, **p.row(sm_count=self.device.sm_count), **self.base}
                try:
                    journal.write(dict(event="start", point_id=p.point_id, row=skeleton))
                    row, fatal = self._measure(p, skeleton)
                    journal.write(dict(event="row", row=row))
                except KeyboardInterrupt:
                    # Stopped from outside (Ctrl-C, SIGTERM), not killed by the point: it is retried once. (An
                    # abandon without a start, if the signal came first, is harmless.)
                    journal.write(dict(event="abandon", point_id=p.point_id, reason="interrupted from outside"))
                    res.stopped = "interrupted"
                    raise
                ran += 1
                res.done += 1
                res.statuses[row["status"]] = res.statuses.get(row["status"], 0) + 1
                progress.update(row["status"])
                if fatal:
                    res.stopped = "aborted"
                    raise SweepAborted(f"the GPU context is unusable after point {p.point_id} ({fatal}); it is stored "
                                       f"as error: run the same command with --resume to go on in a fresh process")
                if ran % self.opts.refresh_every == 0:
                    self._refresh()
        except KeyboardInterrupt:
            if res.stopped != "interrupted":
                res.stopped = "interrupted"
        finally:
            _restore_sigterm(old)
            progress.close()
            self._shape, self._shape_key = None, None

    def _parquet_ids(self) -> set[str]:
        """Points the Parquet holds (all of them are in the journals, unless the journals were deleted)."""
        p = self.dir / "results.parquet"
        return set(pd.read_parquet(p, columns=["point_id"])["point_id"]) if p.is_file() else set()

    def _shape_for(self, w: DecodeWorkload) -> _Shape:
        if self._shape_key != w:
            self._shape, self._shape_key = None, w
            gc.collect()
            _empty_cache()
            try:
                self._shape = _Shape(self.card, w, _torch_device(), self.opts.seed)
            except Exception as e:  # e.g. out of memory: every point of the shape gets this reason
                self._shape = e.with_traceback(None)  # keep no frame (and no half-built tensor) alive
        if isinstance(self._shape, BaseException):
            raise self._shape
        assert self._shape is not None
        return self._shape

    def _measure(self, p: Point, skeleton: dict) -> tuple[dict, str | None]:
        """Check, then time, one point; (row, the sticky CUDA error if the context is gone)."""
        from splitlab.kernels.testing import TOLERANCE, query_dtype, rel_err

        t0 = time.monotonic()
        row = dict(skeleton, timing=self.timer.name)
        fatal = None
        reason = self.card.impl.unavailable()
        if reason is not None:
            row.update(status="skipped", error=reason)
        else:
            try:
                w = p.workload
                shape = self._shape_for(w)
                err = rel_err(self.card.impl.call(w, shape.inputs, p.knobs)(), shape.ref_for(p.facts.get("block_h")))
                tol = TOLERANCE[query_dtype(w.dtype)]
                row["rel_err"] = err
                if not err <= tol:
                    row.update(status="wrong", error=f"rel_err {err:.3g} > tolerance {tol:g} of {w.dtype}; not timed")
                else:
                    impl, knobs = self.card.impl, p.knobs

                    def calls(n: int) -> list:
                        return [impl.call(w, s, knobs) for s in shape.input_sets(n)]

                    t = self.timer.measure(calls, set_bytes=shape.set_bytes, workload=w,
                                           num_splits=p.facts.get("num_splits"))
                    row.update(status="ok", p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, n_samples=t.n_samples,
                               timing_detail=t.method, gbps=w.kv_bytes / (t.p50_us * 1e3) if t.p50_us > 0 else None)
            except Exception as e:
                row.update(status="error", error=_message(e))
                fatal = _cuda_broken()
                if fatal is None:
                    _empty_cache()
        row.update(elapsed_s=round(time.monotonic() - t0, 3), finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return row, fatal

    # -- results ------------------------------------------------------------------------------------------
    def _refresh(self) -> tuple[pd.DataFrame, results.SweepState]:
        df, st = results.rebuild(self.dir)
        results.write_parquet(df, self.dir / "results.parquet", journal_sizes=st.sizes)
        return df, st

    def _finish(self, res: SweepResult) -> results.SweepState:
        """Rebuild the Parquet and the CSV from every journal and record the sessions in the sidecar; returns the
        journals' state as read."""
        df, st = self._refresh()
        tmp = self.dir / f".results.csv.{os.getpid()}.tmp"
        results.to_csv(df, tmp)
        os.replace(tmp, self.dir / "results.csv")
        side = self.sidecar() or {}
        side["sessions"] = [dict(session=h.get("session"), shard=h.get("shard"), timer=h.get("timer"),
                                 card_sha1=h.get("card_sha1"), env=h.get("env")) for h in st.sessions]
        side["rows"] = len(df)
        side["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        _write_json_atomic(self.dir / "sweep.json", side)
        return st


WHERE = ("host", "gpu_index", "gpu_uuid")


def _where(env: dict) -> dict:
    """The row columns saying where a session ran: host, the host's GPU index, the GPU's UUID."""
    dev = env.get("device", {})
    idx = dev.get("index")
    entries = [x.strip() for x in (env.get("cuda_visible_devices") or "").split(",")]
    if idx is not None and idx < len(entries) and entries[idx].isdigit():
        idx = int(entries[idx])  # CUDA_VISIBLE_DEVICES=3: torch's cuda:0 is the host's GPU 3
    return dict(host=env.get("host"), gpu_index=idx, gpu_uuid=dev.get("uuid"))


def _torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def _install_sigterm():
    """SIGTERM -> KeyboardInterrupt (so the point in flight is marked abandoned, not died); main thread only."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(old) -> None:
    import threading

    if old is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, old)


class _Progress:
    """A tqdm bar with ETA on a terminal; on a pipe, a line every 30 s; nothing with ``quiet``."""

    def __init__(self, total: int, *, quiet: bool, label: str) -> None:
        self.total, self.quiet, self.label = total, quiet, label
        self.n, self.counts = 0, {}
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="pt", dynamic_ncols=True, file=sys.stderr)

    def update(self, status: str) -> None:
        self.n += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(self.counts, refresh=False)
        elif not self.quiet and (time.monotonic() - self.last > 30 or self.n == self.total):
            self.last = time.monotonic()
            el = self.last - self.t0
            eta = el / self.n * (self.total - self.n)
            print(f"[{self.label}] {self.n}/{self.total} points, {el / 60:.1f} min, ETA {eta / 60:.1f} min; "
                  + " ".join(f"{k} {v}" for k, v in sorted(self.counts.items())), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(card: Card, options: SweepOptions, *, timer: Timer | None = None) -> SweepResult:
    """Run (or, with ``options.resume``, continue) ``card``'s sweep of ``options.grid``."""
    return Runner(card, options, timer=timer).run()
