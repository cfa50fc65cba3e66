"""The sweep runner behind ``splitlab sweep``: expand a card's grid, check every point against the fp64
reference, time the ones that are right, and write results as it goes.

Per point: the implementation runs once on the shape's inputs and is compared with the reference (computed
once per shape; tolerance ``splitlab.kernels.accuracy.TOLERANCE`` of the input dtype). A wrong point is
stored ``wrong`` and not timed; a point that raises (compile error, out of memory, launch failure) is
stored ``error`` with the reason and the sweep goes on; an implementation that cannot run here (a peer
without a GPU) gives ``skipped`` rows.

Isolation. Each point is measured in a worker process (``splitlab.bench.worker``: one per session, kept from
point to point, replaced after it dies), so a point that crashes the process (a segfault, an abort) is stored
``error`` "worker died with SIGSEGV", and one that runs past ``SweepOptions.point_timeout_s`` (``--point-timeout``)
is killed and stored ``error`` "timed out after N s"; the session goes on with the next point, as it does after
a sticky CUDA error (the worker is replaced). ``isolate=False`` measures in the session's own process
(debugging); a sticky CUDA error then ends the session (``SweepAborted``).

Durability. Each session appends to its own journal (``journal-<session>.jsonl``, one JSON object a line,
flushed and fsynced, the file locked while the session lives): a ``start`` marker before a point runs, its
``row`` after. A resumed sweep skips finished points; a point started in a journal whose session is gone
and never finished killed its process: it is written ``error`` ("process died during this point") and not
retried. A session stopped from outside (Ctrl-C, SIGTERM) marks the point in flight ``abandon``: it is
retried once, then written ``error``. ``results.parquet`` is rebuilt from all journals (one row per point,
``results.best_rows``) every ``refresh_every`` points and when the session ends, so a kill loses at most the
point in flight and a row is never duplicated. Files are written whole, then renamed (``results.tmp_path``);
a session removes the temporary files of dead processes of its host when it opens the folder.

Timelines (``SweepOptions.timelines``, ``--timelines``). Each work-list point that passed its check and was timed is
launched once more with its per-program timeline on (``bench.worker``); the records go into the journal in the line
of the point's row, and ``timelines.parquet`` is rebuilt from the journals beside ``results.parquet``
(``splitlab.sweep_timelines``, which also loads them). An implementation whose work-list launcher records no
timeline (or that has none) is refused in one line.

Damage. The journals are the source of truth: a damaged ``results.parquet`` is moved aside
(``results.parquet.damaged-<time>``) and rebuilt from them; a ``sweep.json`` that is not a JSON object is moved
aside likewise and rebuilt from the journals (sweep id, timer, grid, environment). ``--dry-run`` says so and
writes nothing. A sweep of a newer schema version, or a sidecar whose fields have the wrong type, is refused
with one line (never appended to).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from splitlab import devices, planners, results, sweep_timelines
from splitlab.bench import grid as grid_mod
from splitlab.bench.cards import Card
from splitlab.bench.env import capture
from splitlab.bench.grid import Expansion, Point
from splitlab.bench.timing import FakeTimer, Timer, make_timer
from splitlab.bench.worker import POINT_TIMEOUT_S, Measurer, PointWorker, WorkerFailed
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError

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
    """The sweep stopped because the GPU context is unusable (a sticky CUDA error, measuring in-process) or no
    point worker could be started; resume in a new process."""


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
    point_timeout_s: float | None = POINT_TIMEOUT_S  # a point running longer is killed and stored error; None: no limit
    isolate: bool = True  # measure each point in a worker process (crash/hang isolation); False: in this one
    skip_bad_lines: bool = False  # damaged journal lines: skipped, and their journals rewritten without them
    timelines: bool = False  # record each timed work-list point's per-program timeline (timelines.parquet)


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


def planner_constants(card: Card, grid: str, device: DeviceSpec) -> dict[str, str]:
    """Which constants the ``splitlab`` planner takes for each device ``grid`` plans for (``device`` and the
    blocks' ``planner_devices``): what its choices, the points tagged ``splitlab``, were made with
    (``planners.splitlab.constants_for``; sweep.json records it, and so does each session)."""
    if not card.planner_knobs or "splitlab" not in planners.names(card.kind):
        return {}
    from splitlab.planners.splitlab import constants_for

    devs = [device, *(devices.get(d) for b in card.grid(grid) for d in b.planner_devices)]
    return {d.name: constants_for(d, card.kind).text for d in devs}


def sweep_dir(card: Card, options: SweepOptions) -> Path:
    """``<out>/<card name>-<grid>``: where a sweep's sidecar, journals and results live."""
    return Path(options.out) / f"{card.name}-{options.grid}"


def _write_json_atomic(path: Path, data: dict, *, exclusive: bool = False) -> bool:
    """Write ``path`` whole or not at all; with ``exclusive``, only if it does not exist (False if it did)."""
    tmp = results.tmp_path(path, secrets.token_hex(3))
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
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
        self.size = 0  # bytes of whole lines written
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(self, event: dict) -> None:
        """Append ``event`` as one line, whole or not at all: a write that fails (a full disk, a file-size limit)
        leaves no part of the line and raises ``OSError`` naming the journal."""
        data = (json.dumps(event, default=_json_default, separators=(",", ":")) + "\n").encode()
        line = memoryview(data)
        # Ctrl-C / SIGTERM wait until the line is whole on disk (a signal mid-line would tear the journal).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            while line:
                line = line[os.write(self.fd, line):]
            os.fsync(self.fd)
            self.size += len(data)
        except OSError as e:
            self.rewind(self.size)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def rewind(self, size: int) -> None:
        """Cut the journal back to its first ``size`` bytes (what a failed write or point left after them), as far
        as the file system lets it."""
        try:
            os.ftruncate(self.fd, size)
            os.fsync(self.fd)
            self.size = size
        except OSError:
            pass

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


#: The lock a session holds while it starts (``start_lock``), in the sweep folder.
START_LOCK = ".start.lock"
#: How long a session waits for another that is starting (``START_LOCK``), and when another host's lock is stale.
LOCK_WAIT_S, FOREIGN_LOCK_STALE_S = 120.0, 600.0


def _lock_holder(path: Path) -> tuple[str, float] | None:
    """The text of a lock file and its age in seconds; None once it is gone."""
    try:
        text = path.read_text(errors="replace")
        return text, time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        return "", 0.0


def _lock_is_stale(text: str, age: float) -> bool:
    """Whether a lock's holder (``pid@host token``) is known to be gone: a process of this host that no longer
    runs, another host's lock older than ``FOREIGN_LOCK_STALE_S``, or a lock left empty for 10 s."""
    pid, _, host = text.split(" ")[0].partition("@")
    if not pid.isdigit():
        return age > 10
    if host == results._HOST:
        return not results.pid_alive(int(pid))
    return age > FOREIGN_LOCK_STALE_S


def _break_lock(path: Path, text: str) -> None:
    """Remove a stale lock whose text is ``text``, and only that one (another session may have taken the lock since
    it was read: that lock is put back)."""
    aside = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(3)}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if aside.read_text(errors="replace") != text:  # a live session's, taken a moment ago: back it goes
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)


@contextlib.contextmanager
def start_lock(folder: Path):
    """Hold ``<folder>/.start.lock`` (created with ``O_CREAT | O_EXCL``, holding ``pid@host``) for the block: one
    session of a sweep starts at a time. A lock whose process is gone (``results.pid_alive``) is removed; one
    held by a live process past ``LOCK_WAIT_S`` is one ``SplitlabError`` naming it."""
    path = Path(folder) / START_LOCK
    mine = f"{os.getpid()}@{results._HOST} {secrets.token_hex(4)}"
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = _lock_holder(path)
            if held is None:
                continue  # released a moment ago
            if _lock_is_stale(*held):
                _break_lock(path, held[0])
                continue
            if time.monotonic() > deadline:
                raise SplitlabError(f"{path} is held by {held[0].split(' ')[0] or 'a process'} (a session starting "
                                    f"this sweep) for more than {LOCK_WAIT_S:g} s; expected it released (if no such "
                                    "process runs, remove the file)") from None
            time.sleep(0.05)
            continue
        try:
            os.write(fd, mine.encode())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        break
    try:
        yield
    finally:
        held = _lock_holder(path)
        if held is not None and held[0] == mine:
            path.unlink(missing_ok=True)


def _stamp_aside(path: Path) -> Path:
    """Move a damaged file aside (``<name>.damaged-<UTC time>``), keeping it for inspection; the new name."""
    aside = path.with_name(f"{path.name}.damaged-{_utc_stamp()}-{secrets.token_hex(2)}")
    os.replace(path, aside)
    return aside


# --- the runner ---------------------------------------------------------------------------------------------

class Runner:
    """One session of one sweep (see the module docstring). ``timer`` overrides ``options.timer`` (tests)."""

    def __init__(self, card: Card, options: SweepOptions, *, timer: Timer | None = None) -> None:
        self.card, self.opts = card, options
        self.device = sweep_device(card, options.device)
        self.dir = sweep_dir(card, options)
        self._timer = timer

    # -- planning ----------------------------------------------------------------------------------------
    def expansion(self) -> Expansion:
        return grid_mod.expand(self.card, self.opts.grid, self.device)

    def my_points(self, exp: Expansion) -> list[Point]:
        if self.opts.shard is None:
            return exp.points
        i, n = self.opts.shard
        return grid_mod.shard(exp.points, i, n)

    def sidecar(self) -> dict | None:
        """The sweep's sidecar (checked: ``results.read_sidecar``), None if there is none. One that is not a JSON
        object is rebuilt from the journals (in memory; ``recovered_from`` names the damage, which ``_open``
        moves aside), or None if they hold nothing of the sweep."""
        path = self.dir / "sweep.json"
        try:
            return results.read_sidecar(path)
        except results.DamagedFile as e:
            return self._recover_sidecar(str(e))

    def _recover_sidecar(self, damage: str) -> dict | None:
        """A sidecar rebuilt from what the journals (and a readable Parquet) say: the sweep id, timer, grid,
        kernel, device and the first session's environment; None if they hold no trace of the sweep."""
        st = results.sweep_state(self.dir, skip_bad=self.opts.skip_bad_lines)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pq_path = self.dir / "results.parquet"
            old = results.read_parquet_or_warn(pq_path) if pq_path.is_file() else None
        rows = st.rows + ([] if old is None else old.astype(object).where(old.notna(), None).to_dict("records"))
        heads = st.sessions

        def first(key: str, *sources: list[dict]) -> object:
            return next((x[key] for src in sources for x in src if isinstance(x.get(key), str) and x[key]), None)

        sweep_id = first("sweep_id", heads, rows)
        if sweep_id is None:
            return None  # no session ever wrote a row or a header that names it: a new sweep starts
        env = next((h["env"] for h in heads if isinstance(h.get("env"), dict)
                    and isinstance(h["env"].get("device", {}), dict)), {})
        device = first("device", rows)
        device = asdict(self.device) if device in (None, self.device.name) else dict(name=device)
        return dict(schema_version=results.SCHEMA_VERSION, sweep_id=sweep_id, kernel=first("kernel", rows) or
                    self.card.name, grid=first("grid", heads, rows) or self.opts.grid,
                    timer=first("timer", heads) or first("timing", [r for r in rows if r.get("status") == "ok"]),
                    card=dict(path=str(self.card.path), sha1=first("card_sha1", heads)),
                    device=device, env=env, sessions=[],
                    recovered_from=damage)

    def _damage_note(self, side: dict | None) -> list[str]:
        """Lines saying what is damaged in the folder and how the sweep goes on (``--dry-run``, warnings)."""
        out = []
        if side is not None and side.get("recovered_from"):
            out.append(f"{side['recovered_from']}: the sidecar is damaged; rebuilt from the journals (sweep "
                       f"{side['sweep_id']}), the damaged file is kept as sweep.json.damaged-*")
        elif side is None and (self.dir / "sweep.json").is_file():
            out.append(f"{self.dir / 'sweep.json'}: the sidecar is damaged and the journals hold no trace of the "
                       "sweep; a new sweep starts (the damaged file is kept as sweep.json.damaged-*)")
        pq_path = self.dir / "results.parquet"
        why = results.parquet_damage(pq_path) if pq_path.is_file() else None
        if why is not None:
            out.append(f"{why}; it is rebuilt from the journals (the damaged file is kept as "
                       "results.parquet.damaged-*)")
        return out

    def _state(self) -> tuple[results.SweepState, set[str]]:
        """The journals' state and every finished point (the journals' and a readable Parquet's), checked: a
        journal line or row this schema does not allow, or a newer schema version, is refused here, before
        anything is written."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged Parquet: _damage_note / _open say so
            df, st = results.rebuild(self.dir, skip_bad=self.opts.skip_bad_lines)
        return st, st.finished | set(df["point_id"])

    def _check_files(self) -> None:
        """Refuse (one line) a sweep folder that is a file, or whose sidecar or result files are not files (a
        folder in their place): nothing could be written there."""
        if self.dir.exists() and not self.dir.is_dir():
            raise SplitlabError(f"{self.dir} is a file, not a sweep folder; expected a folder (choose another --out)")
        if self.opts.timelines and not getattr(self.card.impl, "records_timelines", False):
            raise SplitlabError(f"timelines=True is not allowed for card {self.card.name!r}: its implementation "
                                f"({self.card.impl_label}) has no work-list launcher that records timelines; expected "
                                "a card of splitlab's gqa_decode or mla_decode (kernels.worklist)")
        for name in ("sweep.json", "results.parquet", "results.csv", sweep_timelines.FILE):
            path = self.dir / name
            if path.exists() and not path.is_file():
                what = "a folder" if path.is_dir() else "not a regular file"
                raise SplitlabError(f"{path} is {what}; expected the sweep's {name}, a file (move it aside: "
                                    "the journals rebuild it)")

    def _repair(self, st: results.SweepState) -> None:
        """Rewrite the journals whose damaged lines ``st`` skipped (``--skip-bad-lines``) without them, each kept
        as ``<journal>.damaged-<time>``, saying so; a live session's journal is left as it is (read past)."""
        for name in dict.fromkeys(j for j, _, _ in st.bad_lines):
            lines = [(n, why) for j, n, why in st.bad_lines if j == name]
            path = self.dir / name
            if _is_live(path):
                continue
            aside = results.rewrite_journal(path, [n for n, _ in lines])
            print(f"splitlab: warning: {path}: skipped {len(lines)} damaged line(s) ("
                  + "; ".join(f"line {n}: {why}" for n, why in lines[:3]) + ("; ..." if len(lines) > 3 else "")
                  + f"); the journal is rewritten without them, the damaged file kept as {aside.name}",
                  file=sys.stderr)

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
        for dev_name, text in planner_constants(self.card, self.opts.grid, self.device).items():
            lines.append(f"splitlab planner constants for {dev_name}: {text}")
        if self.opts.timelines:
            n = sum(p.schedule is not None for p in pts)
            lines.append(f"--timelines: {n} work-list points record their per-program timelines (if right and timed) "
                         f"into timelines.parquet; the {len(pts) - n} split-count points record none")
        if exp.notes:
            lines.append(f"{len(exp.notes)} planner notes (a planner refused a shape, or chose a knob outside the "
                         "card's range); they go to sweep.json")
        self._check_files()
        side = self.sidecar()
        if self.dir.is_dir():
            lines += [f"warning: {x}" for x in self._damage_note(side)]
        if side is not None:
            st, done = self._state()
            lines += [f"warning: {self.dir / j}: line {n}: {why}; skipped (--skip-bad-lines: the journal would be "
                      "rewritten without it)" for j, n, why in st.bad_lines]
            left = sum(p.point_id not in done for p in pts)
            lines.append(f"{self.dir} exists (sweep {side['sweep_id']}): {len(pts) - left} done, {left} left "
                         "(--resume continues it)")
        else:
            lines.append(f"would write {self.dir}")
        lines.append(f"rough GPU time: {self.estimate_minutes(pts):.0f} min ({EST_POINT_S} s a point, "
                     f"{EST_SHAPE_S} s a shape, plus the modelled kernel time of the replays; compiles not counted)")
        ragged = any(p.workload.ragged for p in pts)  # the lengths' columns only where some batch is ragged
        cols = ["batch", "num_q_heads", "ctx_len", "topk", *(["length_dist", "length_seed", "ctx_mean"] if ragged
                                                              else []), "num_splits", "block_n", "block_k", "block_h",
                "num_warps", "num_stages", "scheduler", "sched_ctas", "ctas", "planners"]
        table = [p.row(sm_count=self.device.sm_count) for p in pts[:rows]]
        if table:
            cols = [k for k in cols if any(r.get(k) not in (None, "", 0) for r in table) or k in ("planners",
                                                                                                 "length_seed")]
            cells = [[_cell(r.get(k)) for k in cols] for r in table]
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
            s += 36 * n * fake.modelled_us(p.workload, p.facts.get("num_splits"), p.schedule) * 1e-6
        return s / 60

    # -- running ------------------------------------------------------------------------------------------
    def _check_timer(self, name: str) -> None:
        """Refuse a GPU timer without a GPU (one line)."""
        if self._timer is None and name != "fake":
            import torch

            if not torch.cuda.is_available():
                raise SplitlabError(f"timer={name!r} needs a CUDA GPU; torch sees none (timer='fake' runs the "
                                    "harness on the CPU with modelled times that are not measurements)")

    def _make_timer(self, name: str) -> Timer:
        if self._timer is not None:
            return self._timer
        self._check_timer(name)
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
        if side is not None and side.get("timer") != timer and not (side.get("recovered_from") and
                                                                     side.get("timer") is None):
            raise SplitlabError(f"timer={timer!r} is not allowed for {self.dir}; expected {side.get('timer')!r}, "
                                "the timer it was started with (one sweep, one timing method)")
        return timer

    def _fresh_sidecar(self, exp: Expansion, env: dict, timer: str) -> dict:
        return dict(
            schema_version=results.SCHEMA_VERSION,
            sweep_id=f"{self.card.name}-{self.opts.grid}-{_utc_stamp()}-{secrets.token_hex(2)}",
            kernel=self.card.name, impl=self.card.impl_label, impl_import=self.card.impl_import,
            kind=self.card.kind, seeds=list(self.card.seeds), grid=self.opts.grid, timer=timer,
            card=dict(path=str(self.card.path), sha1=self.card.sha1, text=self.card.text),
            compare=list(self.card.compare), planner_knobs=list(self.card.planner_knobs),
            device=asdict(self.device), counts=exp.counts(), planner_notes=exp.notes,
            planner_constants=planner_constants(self.card, self.opts.grid, self.device),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), env=env, sessions=[],
        )

    def _set_aside(self, name: str, why: str) -> None:
        """Move a damaged file of the sweep folder aside, unless another session has just done so (and maybe
        written a sound one in its place)."""
        path = self.dir / name
        if name == "results.parquet":
            if results.parquet_damage(path) is None:
                return
        else:
            try:
                results.read_sidecar(path)
                return  # sound (or gone)
            except results.DamagedFile:
                pass
        try:
            aside = _stamp_aside(path)
        except FileNotFoundError:
            return
        print(f"splitlab: warning: {why}; moved to {aside.name}, rebuilt from the journals", file=sys.stderr)

    def _open(self, exp: Expansion, env: dict, timer: str) -> dict:
        """Create the sweep folder and sidecar, or check an existing one (kernel, grid, device) for --resume;
        remove dead processes' temporary files; move a damaged sidecar or Parquet aside (rebuilt from the
        journals)."""
        side = self.sidecar()
        if self.dir.is_dir():
            results.clean_stale_tmp(self.dir)
            why = results.parquet_damage(self.dir / "results.parquet") \
                if (self.dir / "results.parquet").is_file() else None
            if why is not None:
                self._set_aside("results.parquet", why)
            if side is None and (self.dir / "sweep.json").exists():
                self._set_aside("sweep.json", f"{self.dir / 'sweep.json'}: damaged, and no journal names the sweep")
        if side is not None and side.get("recovered_from"):
            self._set_aside("sweep.json", side["recovered_from"])
            fresh = self._fresh_sidecar(exp, env, timer)
            side = {**fresh, **{k: v for k, v in side.items() if v not in (None, {}, [])}, "timer": timer}
            side["rebuilt_from"] = side.pop("recovered_from")  # a record, not a state: the file is sound again
            side.pop("created", None)
            if not _write_json_atomic(self.dir / "sweep.json", side, exclusive=True):
                side = self.sidecar()  # another shard rebuilt it a moment ago
        if side is None:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SplitlabError(f"{self.dir}: cannot be made a sweep folder ({e.strerror or e}); choose another "
                                    "--out") from None
            new = self._fresh_sidecar(exp, env, timer)
            if not _write_json_atomic(self.dir / "sweep.json", new, exclusive=True):
                side = self.sidecar()  # another shard created it a moment ago
            else:
                side = new
        if side is None:
            raise SplitlabError(f"{self.dir / 'sweep.json'}: another session replaced it while this one opened the "
                                "sweep; run the command again")
        for key, mine in (("kernel", self.card.name), ("grid", self.opts.grid)):
            if side.get(key) != mine:
                raise SplitlabError(f"{self.dir} holds a sweep of {key}={side.get(key)!r}; expected {mine!r}")
        theirs, mine = side.get("env", {}).get("device", {}).get("name"), env["device"]["name"]
        if theirs != mine:
            raise SplitlabError(f"{self.dir} was measured on {theirs!r}; this machine has {mine!r} (start a new "
                                "sweep with another --out)")
        planned = side.get("device", {}).get("name")
        if planned is not None and planned != self.device.name:
            raise SplitlabError(f"device={self.device.name!r} is not allowed for {self.dir}; expected {planned!r}, "
                                "the device it was planned for (one sweep, one device: pass --device "
                                f"{planned} or choose another --out)")
        if side.get("card", {}).get("sha1") != self.card.sha1:
            print(f"splitlab: warning: {self.card.path} changed since {self.dir} was started; finished points are "
                  "kept, the grid is expanded from the card as it is now", file=sys.stderr)
        return side

    def _live_conflict(self) -> None:
        for j in results.journals(self.dir):
            if not _is_live(j):
                continue
            for _ in range(20):  # a session that has just opened its journal writes its header next
                events = results.read_journal(j, [] if self.opts.skip_bad_lines else None)
                head = next((e for e in events if e.get("event") == "session"), {})
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
        """Run (or resume) the sweep; returns what this session did. Raises ``SweepAborted`` when no point worker
        can be started, or (``isolate=False``) after a sticky CUDA error (the point is stored; resume in a fresh
        process). A file that cannot be written (a full disk, a file-size limit) is one ``SplitlabError``: what
        was finished is kept, and ``--resume`` goes on (the point in flight is run again)."""
        self._check_files()
        try:
            return self._run()
        except OSError as e:
            raise results.write_failed(e, self.dir, "then run the same command with --resume (the finished points "
                                       "are kept)") from None

    def _run(self) -> SweepResult:
        exp = self.expansion()
        timer_name = self._timer_name()
        self._check_timer(timer_name)
        env = capture(self.opts.argv)
        side = self._open(exp, env, timer_name)
        # Sessions start one at a time (the lock), each writing its journal's header before the next looks for live
        # sessions on its points: two sessions started at once on the same points cannot both run.
        with start_lock(self.dir):
            self._live_conflict()
            st, done = self._state()  # refuses what this schema cannot read before anything is written
            self._repair(st)
            session = f"{_utc_stamp()}-{os.getpid()}-{secrets.token_hex(2)}"
            journal = Journal(self.dir / f"journal-{session}.jsonl")
            try:
                journal.write(dict(event="session", session=session, sweep_id=side["sweep_id"],
                                   shard=self.opts.shard, timer=timer_name, grid=self.opts.grid,
                                   card_sha1=self.card.sha1, env=env, timelines=self.opts.timelines,
                                   planner_constants=planner_constants(self.card, self.opts.grid, self.device)))
            except BaseException:
                journal.close()
                raise
        res = SweepResult(self.dir, side["sweep_id"], session)
        self.sweep_id, self.session = side["sweep_id"], session
        base = dict(schema_version=results.SCHEMA_VERSION, sweep_id=side["sweep_id"], grid=self.opts.grid,
                    device=self.device.name, sm_count=self.device.sm_count, session=session, **_where(env))
        self.base = base
        self.blank = dict.fromkeys(results.COLUMNS)  # every row carries every column
        try:
            self._loop(exp, journal, res, st, done, timer_name)
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
        damaged = {j for j, _, _ in st.bad_lines}  # a start there may have lost its row to the damage: run it again
        finished, settled = st.finished, set()
        for pid, starts in st.starts.items():
            if pid in finished or pid not in mine or any(jn in live or jn in damaged for jn, _ in starts):
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

    def _measurer(self, timer_name: str) -> PointWorker | Measurer:
        """What measures this session's points: a worker process (``isolate``), or this process."""
        if self.opts.isolate:
            return PointWorker(self.card.impl, self._timer if self._timer is not None else timer_name, self.device,
                               self.opts.seed, self.opts.point_timeout_s, self.opts.timelines)
        return Measurer(self.card.impl, self._make_timer(timer_name), self.opts.seed, self.opts.timelines)

    def _loop(self, exp: Expansion, journal: Journal, res: SweepResult, st: results.SweepState, done: set[str],
              timer_name: str) -> None:
        pts = self.my_points(exp)
        done = done | self._settle_dead(st, journal, res, {p.point_id for p in pts} - done)
        res.total = len(pts)
        pending = [p for p in pts if p.point_id not in done]
        res.done = res.total - len(pending)
        if not pending:
            return
        progress = _Progress(len(pending), quiet=self.opts.quiet, label=f"{self.card.name}/{self.opts.grid}")
        deadline = time.monotonic() + 60 * self.opts.max_minutes if self.opts.max_minutes else None
        ran = 0
        old = _install_sigterm()
        measurer = None
        try:
            measurer = self._measurer(timer_name)
            for p in pending:
                if self.opts.limit is not None and ran >= self.opts.limit:
                    res.stopped = "limit"
                    break
                if deadline is not None and ran and time.monotonic() > deadline:  # always make progress
                    res.stopped = "time"
                    break
                skeleton = {**self.blank, **p.row(sm_count=self.device.sm_count), **self.base}
                mark = journal.size
                try:
                    if isinstance(measurer, PointWorker):
                        try:
                            measurer.start()  # before the start marker: a worker that cannot start costs no point
                        except WorkerFailed as e:
                            res.stopped = "aborted"
                            raise SweepAborted(f"{e}; nothing of point {p.point_id} ran: run the same command with "
                                               "--resume") from None
                    journal.write(dict(event="start", point_id=p.point_id, row=skeleton))
                    if isinstance(measurer, PointWorker):
                        row, fatal = measurer.measure(p, skeleton), None
                    else:
                        row, fatal = measurer.measure(p, skeleton)
                    # A point's timeline travels in its row's line: both are written, or neither.
                    recs = {} if measurer.timeline is None else {"timeline": measurer.timeline}
                    journal.write(dict(event="row", row=row, **recs))
                except OSError:
                    # A write failed (a full disk, a file-size limit): no trace of the point is left, so that
                    # --resume runs it again.
                    journal.rewind(mark)
                    res.stopped = "failed"
                    raise
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
            if isinstance(measurer, PointWorker):
                measurer.close(kill=res.stopped in ("interrupted", "aborted"))
            elif measurer is not None:
                measurer.drop_shape()
            _restore_sigterm(old)
            progress.close()

    # -- results ------------------------------------------------------------------------------------------
    def _refresh(self) -> tuple[pd.DataFrame, results.SweepState]:
        df, st = results.rebuild(self.dir, skip_bad=self.opts.skip_bad_lines)
        results.write_parquet(df, self.dir / "results.parquet", journal_sizes=st.sizes)
        if self.opts.timelines or (self.dir / sweep_timelines.FILE).is_file():
            sweep_timelines.refresh(self.dir, df, st.sizes)
        return df, st

    def _finish(self, res: SweepResult) -> tuple[pd.DataFrame, results.SweepState]:
        """Rebuild the Parquet and the CSV from every journal and record the sessions in the sidecar; returns the
        rows written and the journals' state as read."""
        df, st = self._refresh()
        tmp = results.tmp_path(self.dir / "results.csv")
        try:
            results.to_csv(df, tmp)
            os.replace(tmp, self.dir / "results.csv")
        finally:
            tmp.unlink(missing_ok=True)
        side = self.sidecar() or {}
        if "recovered_from" in side:  # damaged since this session opened it: what the journals say is written
            side["rebuilt_from"] = side.pop("recovered_from")
        side["sessions"] = [dict(session=h.get("session"), shard=h.get("shard"), timer=h.get("timer"),
                                 card_sha1=h.get("card_sha1"), env=h.get("env"), timelines=h.get("timelines", False),
                                 planner_constants=h.get("planner_constants")) for h in st.sessions]
        side["rows"] = len(df)
        side["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        _write_json_atomic(self.dir / "sweep.json", side)
        return df, st


WHERE = ("host", "gpu_index", "gpu_uuid")


def _cell(v: object) -> str:
    """A value of the dry run's table: blank for None, floats to one decimal."""
    return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def _where(env: dict) -> dict:
    """The row columns saying where a session ran: host, the host's GPU index, the GPU's UUID."""
    dev = env.get("device", {})
    idx = dev.get("index")
    entries = [x.strip() for x in (env.get("cuda_visible_devices") or "").split(",")]
    if idx is not None and idx < len(entries) and entries[idx].isdigit():
        idx = int(entries[idx])  # CUDA_VISIBLE_DEVICES=3: torch's cuda:0 is the host's GPU 3
    return dict(host=env.get("host"), gpu_index=idx, gpu_uuid=dev.get("uuid"))


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
