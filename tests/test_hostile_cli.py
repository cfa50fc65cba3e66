"""Hostile input to the command lines and the files they read (issue 39, all but the kernels' launchers, which
``tests/test_hostile_kernels.py`` covers): each is refused in one line (``splitlab: error: ...``, exit code 2) or
handled, never a traceback, never a silent wrong answer."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sweep_fixtures import tiny_card

from splitlab import catalog, fit, planners, plugins, results, workloads
from splitlab.args import run_main
from splitlab.bench import cards, sweep
from splitlab.bench.sweep import SweepOptions
from splitlab.cli import main
from splitlab.errors import SplitlabError
from splitlab.planners import fitted, registry
from splitlab.planners.registry import Plan

REPO = Path(__file__).resolve().parents[1]
SHIPPED = fitted.SHIPPED_DIR / "h200-sxm.toml"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith("splitlab: error: "), (code, err)
    assert needle in err, err


# --- 1. constants files: every constant bounded by its meaning -----------------------------------------------

def _constants_with(tmp_path: Path, key: str, value: str, family: str = "gqa") -> Path:
    text = SHIPPED.read_text()
    start = text.index(f"[{family}]\n")
    line = re.compile(rf"^{key} = .*$", re.M).search(text, start)
    path = tmp_path / "bad.toml"
    path.write_text(text[:line.start()] + f"{key} = {value}" + text[line.end():])
    return path


@pytest.mark.parametrize("key, value, needle", [
    ("fixed", "-1e6", "gqa.fixed=-1000000.0 is not allowed; expected a finite number in [0, 1e6]: a cost"),
    ("combine_per_split", "-0.5", "gqa.combine_per_split=-0.5 is not allowed"),
    ("partial", "-1", "gqa.partial=-1 is not allowed"),
    ("tail", "2.0", "gqa.tail=2.0 is not allowed; expected a finite number in [0, 1]"),
    ("ctas_per_sm", "0", "gqa.ctas_per_sm=0 is not allowed; expected an integer in [1, 64]"),
    ("ctas_per_sm_narrow", "100000", "gqa.ctas_per_sm_narrow=100000 is not allowed"),
    ("max_splits", "4096", "gqa.max_splits=4096 is not allowed; expected an integer in [1, 128]: the gqa kernels' "
                           "split limit"),
    ("sm90_tile", "0.0", "gqa.sm90_tile=0.0 is not allowed; expected a finite number in (0, 1e6]"),
])
def test_a_constant_outside_its_meaning_is_refused(tmp_path, capsys, key, value, needle):
    path = _constants_with(tmp_path, key, value)
    code, out, err = run(capsys, "plan", "--kind", "gqa", "--batch", "1", "--ctx", "64k", "--planner", "splitlab",
                         "--constants", str(path))
    one_line_error(code, err, needle)
    assert str(path) in err and out == ""


def test_every_constant_has_bounds_and_the_shipped_files_keep_them():
    assert set(fitted.BOUNDS) == {f for f in fitted.CostConstants.__dataclass_fields__}
    from splitlab.planners import splitlab as rule

    assert rule.MAX_SPLITS is fitted.MAX_SPLITS
    for fc in fitted.shipped().values():
        for kind, c in fc.families.items():
            assert c.max_splits <= fitted.MAX_SPLITS[kind] and c.fixed >= 0


# --- 2. a plugin's plan: at most the kernels' split limit ------------------------------------------------------

@pytest.fixture
def registry_copy(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(plugins.ENV_PLUGINS, raising=False)


def test_a_plugin_plan_past_the_kernels_limit_is_refused_naming_the_planner(registry_copy, capsys):
    planners.register("too_many", lambda w, dev: Plan("too_many", 10**12), kinds=("gqa",))
    planners.register("too_many_each", lambda w, dev: Plan("too_many_each", 8, per_request=(8, 70000)),
                      kinds=("gqa",))
    w = workloads.get("llama-3-8b")
    with pytest.raises(SplitlabError, match=r"planner 'too_many' \(.*\) returned num_splits=1000000000000; expected "
                       r"at most 65535 splits \(the gqa kernels' limit\)"):
        planners.plan(w, "h200", "too_many")
    with pytest.raises(SplitlabError, match="too_many_each.*a per_request split count of 70000"):
        planners.plan(w, "h200", "too_many_each")
    code, out, err = run(capsys, "plan", "--kind", "gqa", "--planner", "too_many")
    one_line_error(code, err, "planner 'too_many'")
    assert out == ""


def test_the_registry_s_split_limits_are_the_kernels():
    from splitlab.kernels import gqa, mla

    assert registry.KERNEL_MAX_SPLITS == {"gqa": gqa.MAX_SPLITS, "mla": mla.MAX_SPLITS, "sparse_mla": mla.MAX_SPLITS}


# --- 3. SPLITLAB_CONSTANTS for another device: refused as --constants is ---------------------------------------

def test_env_constants_for_another_device_are_refused_like_the_flag(monkeypatch, capsys):
    monkeypatch.setenv("SPLITLAB_CONSTANTS", str(SHIPPED))
    code, out, err = run(capsys, "plan", "--kind", "gqa", "--device", "b200", "--planner", "splitlab")
    one_line_error(code, err, f"SPLITLAB_CONSTANTS={str(SHIPPED.resolve())!r} holds constants fitted for h200-sxm; "
                              "expected --device h200-sxm among the devices")
    code, out, err = run(capsys, "plan", "--kind", "gqa", "--device", "b200", "--planner", "splitlab", "--constants",
                         str(SHIPPED))
    one_line_error(code, err, "--constants=")
    code, out, err = run(capsys, "plan", "--kind", "gqa", "--device", "h200,b200", "--planner", "splitlab")
    assert code == 0 and "SPLITLAB_CONSTANTS=h200-sxm (shipped)" in out, err


# --- 4. a plugin that ends the process while imported -----------------------------------------------------------

@pytest.mark.parametrize("body, name", [("raise SystemExit(0)", "SystemExit: 0"),
                                        ("import sys\nsys.exit('bye')", "SystemExit: bye"),
                                        ("raise GeneratorExit()", "GeneratorExit")])
def test_a_plugin_that_exits_while_imported_is_one_line(registry_copy, tmp_path, capsys, body, name):
    plugin = tmp_path / "exits_on_import.py"
    plugin.write_text(body + "\n")
    try:
        code, out, err = run(capsys, "--plugin", str(plugin), "plan", "--kind", "gqa")
    finally:
        sys.modules.pop("exits_on_import", None)
    one_line_error(code, err, f"--plugin={str(plugin)!r} cannot be imported: {name}")
    assert out == ""


def test_ctrl_c_in_a_plugin_stays_ctrl_c(registry_copy, tmp_path):
    plugin = tmp_path / "interrupts_on_import.py"
    plugin.write_text("raise KeyboardInterrupt\n")
    try:
        with pytest.raises(KeyboardInterrupt):
            plugins.import_plugin(str(plugin))
    finally:
        sys.modules.pop("interrupts_on_import", None)


# --- 6. the catalog: what is wrong with it, and no path out of data/ ----------------------------------------------

CATALOG_TEXT = (REPO / "data" / "catalog.toml").read_text()


@pytest.mark.parametrize("text, needle", [
    ("", "the catalog is empty"),
    ("# the header's comments, then nothing\n", "the catalog holds no [sets.NAME] or [bench.NAME] table"),
    (CATALOG_TEXT[: CATALOG_TEXT.index("[sets.h200]") + 30], "not valid TOML"),
    ("[sets.x]\npath = = 'x'\n", "not valid TOML (Invalid value (at line 2, column 8))"),
    (CATALOG_TEXT.replace('path = "h200"', 'path = "../../../../etc"', 1),
     "[sets.h200] path = '../../../../etc' is not allowed; expected a folder inside"),
    (CATALOG_TEXT.replace('path = "h200"', 'path = "/etc"', 1), "[sets.h200] path = '/etc' is not allowed"),
    (CATALOG_TEXT.replace('path = "h200"', 'path = "h200/../../.."', 1), "[sets.h200] path = 'h200/../../..'"),
    ("[sets.x]\npath = 'x'\nsweeps = ['../../etc']\nroles = ['archive']\nkernel_version = 1\ncommand = 'c'\n"
     "purpose = 'p'\n", "[sets.x] sweeps = '../../etc' is not allowed"),
    ("sets = 3\n", "[sets] is not allowed; expected tables [sets.NAME]"),
])
def test_a_broken_catalog_says_what_is_wrong(tmp_path, monkeypatch, capsys, text, needle):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(SplitlabError) as e:
        catalog.read(path)
    assert needle in str(e.value) and str(path) in str(e.value) and "does not exist" not in str(e.value), e.value
    monkeypatch.setattr(catalog, "CATALOG", path)
    code, out, err = run(capsys, "fit", "--allow-fake")
    one_line_error(code, err, needle)


def test_a_catalog_without_the_role_asked_for_does_not_say_it_does_not_exist(tmp_path, monkeypatch, capsys):
    path = tmp_path / "catalog.toml"
    path.write_text("[sets.x]\npath = 'x'\nroles = ['archive']\nkernel_version = 1\ncommand = 'c'\npurpose = 'p'\n")
    monkeypatch.setattr(catalog, "CATALOG", path)
    code, out, err = run(capsys, "fit")
    one_line_error(code, err, f"{path} holds no set with the role fit")


# --- 7. flags: the closest one for a typo, a plugin file that is not there -------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["plan", "--worklaod", "llama-3-8b"], "unrecognized arguments: --worklaod llama-3-8b (--worklaod: did you mean "
                                           "--workload?)"),
    (["plan", "--kind", "gqa", "--devcie=h200"], "(--devcie: did you mean --device?)"),
    (["sweep", "gqa_decode", "--dryrun"], "(--dryrun: did you mean --dry-run?)"),
    (["--verison"], "(--verison: did you mean --version?)"),
    (["plan", "--kind", "gqa", "--zzzzzz"], "unrecognized arguments: --zzzzzz; expected the flags `-h` lists"),
])
def test_an_unknown_flag_gets_the_closest_one(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    one_line_error(code, err, needle)


def test_a_missing_plugin_file_is_said_to_be_missing(registry_copy, tmp_path, capsys):
    code, out, err = run(capsys, "--plugin", str(tmp_path / "missing.py"), "plan", "--kind", "gqa")
    one_line_error(code, err, f"--plugin={str(tmp_path / 'missing.py')!r} does not exist")
    (tmp_path / "folder.py").mkdir()
    code, out, err = run(capsys, "--plugin", str(tmp_path / "folder.py"), "plan", "--kind", "gqa")
    one_line_error(code, err, "is not a file")
    code, out, err = run(capsys, "--plugin", str(tmp_path / "plugin.txt"), "plan", "--kind", "gqa")
    one_line_error(code, err, "is not a .py file")


# --- 10. report -p: values bounded before they are walked -------------------------------------------------------

def _laughs(levels: int = 9) -> str:
    names = "abcdefghijklmnop"
    out = ["&a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    out += [f"&{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(out) + "]"


@pytest.mark.parametrize("text, needle", [
    (_laughs(), "more than 1000 items"),
    ("[" + ", ".join(["1"] * 40_000) + "]", "120000 characters; expected a value of at most 10000"),
    ("&a [*a]", "is nested more than 16 levels deep"),  # a list that holds itself
    ("[" * 40 + "]" * 40, "nested more than 16 levels deep"),
    ("[" * 4000 + "]" * 4000, "is not YAML"),  # past the YAML parser's recursion
])
def test_a_huge_or_recursive_parameter_value_is_refused_at_once(text, needle):
    from splitlab.report_parameters import notebook_arguments

    declared = {"waves": {"devices": {"inferred_type_name": "list"}}}
    t0 = time.monotonic()
    with pytest.raises(SplitlabError) as e:
        notebook_arguments(["waves"], REPO / "notebooks", {"devices": text}, declared=declared)
    assert time.monotonic() - t0 < 1.0
    assert needle in str(e.value) and str(e.value).startswith("-p devices=") and "\n" not in str(e.value), e.value


# --- 5, 8, 9. sweeps: damaged folders, interrupts, two sessions at once, full disks --------------------------------

def _card(tmp_path: Path, impl: str = "exact") -> Path:
    path = tmp_path / f"{impl}.toml"
    path.write_text(tiny_card(f"t_{impl}", impl))
    return path


def _opts(tmp_path: Path, **kw) -> SweepOptions:
    kw.setdefault("isolate", False)  # measured in this process: no worker to start
    return SweepOptions(out=tmp_path / "runs", grid="quick", timer="fake", device="h200", quiet=True, **kw)


def _sweep(tmp_path: Path, *extra: str) -> list[str]:
    return ["sweep", str(tmp_path / "exact.toml"), "--grid", "quick", "--out", str(tmp_path / "runs"), "--timer",
            "fake", "--device", "h200", "--quiet", *extra]


def _points(tmp_path: Path) -> int:
    from splitlab.bench import grid

    return len(grid.expand(cards.load(tmp_path / "exact.toml"), "quick", "h200").points)


@pytest.mark.parametrize("name", ["results.parquet", "results.csv", "sweep.json"])
def test_a_folder_in_place_of_a_result_file_is_one_line(tmp_path, capsys, name):
    res = sweep.run(cards.load(_card(tmp_path)), _opts(tmp_path, limit=3))
    path = res.sweep_dir / name
    path.unlink()
    path.mkdir()
    for extra in (["--resume"], ["--dry-run"]):
        code, out, err = run(capsys, *_sweep(tmp_path, *extra))
        one_line_error(code, err, f"{path} is a folder; expected the sweep's {name}, a file")
    assert path.is_dir() and len(results.journals(res.sweep_dir)) == 1  # nothing written, nothing moved


DAMAGED_LINES = {
    "not JSON": (lambda line: b'{"event": "row", "row": {"point_id": 7', "is not JSON"),
    "not an object": (lambda line: b"[1, 2, 3]", "is a JSON list; expected an event"),
    "a bad row": (lambda line: line.replace(b'"batch":1', b'"batch":"one"').replace(b'"batch":2', b'"batch":"two"'),
                  "column batch holds"),
    "no point id": (lambda line: line.replace(b'"point_id":', b'"point":'), "point_id=None; expected a string"),
}


@pytest.mark.parametrize("damage", list(DAMAGED_LINES))
def test_a_damaged_journal_line_is_named_and_skip_bad_lines_keeps_the_others(tmp_path, capsys, damage):
    res = sweep.run(cards.load(_card(tmp_path)), _opts(tmp_path, limit=6))
    journal = results.journals(res.sweep_dir)[0]
    lines = journal.read_bytes().split(b"\n")
    row_at = [i for i, x in enumerate(lines) if x.startswith(b'{"event":"row"')][2]  # the third point's row
    harm, needle = DAMAGED_LINES[damage]
    lines[row_at] = harm(lines[row_at])
    journal.write_bytes(b"\n".join(lines))
    code, out, err = run(capsys, *_sweep(tmp_path, "--resume"))
    one_line_error(code, err, f"{journal}: line {row_at + 1}")
    assert needle in err and "--skip-bad-lines" in err
    code, out, err = run(capsys, *_sweep(tmp_path, "--resume", "--skip-bad-lines"))
    n = _points(tmp_path)
    assert code == 0 and f"{n}/{n} points done" in out, err
    assert f"{journal}: skipped 1 damaged line(s) (line {row_at + 1}: " in err and err.count("\n") == 1, err
    assert len(list(res.sweep_dir.glob(f"{journal.name}.damaged-*"))) == 1  # kept for inspection
    new = [j for j in results.journals(res.sweep_dir) if j != journal]
    # The five good rows were kept; so was the damaged one's point, which the first session's Parquet holds.
    assert len(results.journal_rows(new[0])) == n - 6
    df = results.load(res.sweep_dir)
    assert len(df) == n and df.point_id.is_unique and (df.status == "ok").all()
    code, out, err = run(capsys, *_sweep(tmp_path, "--resume"))  # sound again: the flag is no longer needed
    assert code == 0 and "nothing to do" in out, err


def test_a_live_session_s_journal_is_read_past_not_rewritten(tmp_path):
    card = cards.load(_card(tmp_path))
    res = sweep.run(card, _opts(tmp_path, limit=2))
    live = sweep.Journal(res.sweep_dir / "journal-29990101T000000Z-1-aaaa.jsonl")
    try:
        live.write(dict(event="session", session="x", shard=[1, 2], env={"pid": 1}))
        os.write(live.fd, b"{not json\n")
        live.write(dict(event="abandon", point_id="p"))
        with pytest.raises(SplitlabError, match="is not JSON"):
            sweep.run(card, _opts(tmp_path, resume=True, shard=(0, 2)))
        done = sweep.run(card, _opts(tmp_path, resume=True, shard=(0, 2), skip_bad_lines=True))
        assert done.left == 0 and b"{not json" in live.path.read_bytes()
    finally:
        live.close()


def test_two_sessions_started_at_once_on_the_same_points_do_not_both_run(tmp_path, monkeypatch):
    card = cards.load(_card(tmp_path, "slow"))
    monkeypatch.setenv("SWEEP_SLOW_S", "0.05")
    real = sweep.Runner._state

    def slow_state(self):  # widen the moment between looking for live sessions and opening one's own journal
        time.sleep(0.5)
        return real(self)

    monkeypatch.setattr(sweep.Runner, "_state", slow_state)
    outcome = []

    def session():
        try:
            outcome.append(sweep.run(card, SweepOptions(out=tmp_path / "runs", grid="quick", timer="fake",
                                                        device="h200", quiet=True, isolate=False, resume=True)))
        except SplitlabError as e:
            outcome.append(e)

    threads = [threading.Thread(target=session) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    refused = [x for x in outcome if isinstance(x, SplitlabError)]
    assert len(outcome) == 2 and len(refused) == 1, outcome
    assert "is being swept by a live session" in str(refused[0]) and "\n" not in str(refused[0])
    sweep_dir = tmp_path / "runs" / "t_slow-quick"
    rows = [r for j in results.journals(sweep_dir) for r in results.journal_rows(j)]
    assert len(rows) == len({r["point_id"] for r in rows}) == _points_of(card)  # every point once
    assert not (sweep_dir / sweep.START_LOCK).exists()


def _points_of(card) -> int:
    from splitlab.bench import grid

    return len(grid.expand(card, "quick", "h200").points)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_start_lock_of_a_dead_process_is_removed_and_a_live_one_waited_for(tmp_path, monkeypatch):
    card = cards.load(_card(tmp_path))
    sweep_dir = tmp_path / "runs" / "t_exact-quick"
    sweep_dir.mkdir(parents=True)
    lock = sweep_dir / sweep.START_LOCK
    lock.write_text(f"{_dead_pid()}@{results._HOST} abcd")
    assert sweep.run(card, _opts(tmp_path, limit=1)).done == 1 and not lock.exists()
    lock.write_text(f"{os.getpid()}@{results._HOST} abcd")  # a live process holds it
    monkeypatch.setattr(sweep, "LOCK_WAIT_S", 0.3)
    with pytest.raises(SplitlabError, match=rf"{re.escape(str(lock))} is held by {os.getpid()}@"):
        sweep.run(card, _opts(tmp_path, resume=True))
    assert lock.exists()  # not ours to remove


def _fail_journal_writes(monkeypatch, code: int, after: int) -> None:
    """``os.write`` to a sweep journal fails with ``code`` after ``after`` writes (a full disk, a size limit)."""
    real, seen = os.write, [0]

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith(".jsonl"):
            seen[0] += 1
            if seen[0] > after:
                raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_full_disk_mid_sweep_is_one_line_and_resume_recovers_the_rows(tmp_path, capsys, monkeypatch, code):
    _card(tmp_path)
    with monkeypatch.context() as m:
        _fail_journal_writes(m, code, after=8)  # the header, then a few points' start and row
        rc, out, err = run(capsys, *_sweep(tmp_path))
    one_line_error(rc, err, f"cannot be written ({os.strerror(code)}); the disk is full or a file-size limit")
    assert "--resume" in err and "journal-" in err
    sweep_dir = tmp_path / "runs" / "t_exact-quick"
    kept = [r["point_id"] for j in results.journals(sweep_dir) for r in results.journal_rows(j)]
    assert len(kept) >= 3
    rc, out, err = run(capsys, *_sweep(tmp_path, "--resume"))
    n = _points(tmp_path)
    assert rc == 0 and f"{n}/{n} points done" in out, err
    df = results.load(sweep_dir)
    assert len(df) == n and df.point_id.is_unique and (df.status == "ok").all()  # the point in flight ran again
    assert not list(sweep_dir.glob(".*.tmp")) and not (sweep_dir / sweep.START_LOCK).exists()


# --- 9. fit --out: a full disk, a killed write, the umask ----------------------------------------------------------

FITTED = fitted.load(SHIPPED)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_fit_out_on_a_full_disk_is_one_line_and_keeps_the_old_file(tmp_path, capsys, monkeypatch, code):
    out = tmp_path / "my.toml"
    out.write_text("old\n")
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    assert run_main("splitlab", lambda: fit.write(FITTED, out) or 0) == 2
    err = capsys.readouterr().err
    one_line_error(2, err, f"{out}: cannot be written ({os.strerror(code)}); the disk is full")
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["my.toml"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_fit_out_honours_the_umask_and_cleans_what_a_killed_write_left(tmp_path, umask, mode):
    out = tmp_path / "my.toml"
    dead = _dead_pid()
    stale = tmp_path / f".my.toml.{dead}@{results._HOST}.a1b2c3.tmp"  # a fit killed mid-write (SIGKILL)
    alive = tmp_path / f".my.toml.{os.getppid()}@{results._HOST}.a1b2c3.tmp"  # a live process's: left alone
    stale.write_text("x")
    alive.write_text("x")
    old = os.umask(umask)
    try:
        fit.write(FITTED, out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert fitted.load(out).families == FITTED.families
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "my.toml"])


def test_fit_out_killed_mid_write_leaves_only_what_the_next_write_removes(tmp_path):
    out = tmp_path / "my.toml"
    script = (f"import os, signal\nfrom splitlab import fit\nfrom splitlab.planners import fitted\n"
              f"real = os.write\nos.write = lambda fd, b: os.kill(os.getpid(), signal.SIGKILL)\n"
              f"fit.write(fitted.load({str(SHIPPED)!r}), __import__('pathlib').Path({str(out)!r}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".my.toml.") and not out.exists()
    fit.write(FITTED, out)
    assert [p.name for p in tmp_path.iterdir()] == ["my.toml"]


# --- 11. an oversized card: refused from its lists' lengths, at once --------------------------------------------------

@pytest.mark.parametrize("block, needle", [
    ("num_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = {batches}\nctx_len = {ctxs}\n"
     "num_splits = [1, 2, 3, 4, 5, 6, 7, 8]\nblock_n = [16, 32, 64]\n",
     "grids.default makes up to "),
    ("num_q_heads = 4\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = {batches}\nctx_len = {ctxs}\n"
     "[[grids.a]]\nnum_q_heads = 8\nnum_kv_heads = 2\nhead_dim_qk = 16\nbatch = {batches}\n"
     "ctx_len = {ctxs}\n[[grids.b]]\nnum_q_heads = 16\nnum_kv_heads = 2\nhead_dim_qk = 16\n"
     "batch = {batches}\nctx_len = {ctxs}\n", "the grids make up to 200004 shapes (at grids.a[0]); expected at most "
                                                "200000 a card"),
])
def test_an_oversized_card_is_refused_before_its_grid_is_built(tmp_path, block, needle):
    batches, ctxs = list(range(1, 101)), list(range(64, 64 * 1001, 64))  # 100 x 1000 shapes a block
    text = tiny_card("huge", default=block.format(batches=batches, ctxs=ctxs))
    path = tmp_path / "huge.toml"
    path.write_text(text)
    cards.load(_card(tmp_path))  # the kernel's modules imported: what is timed is the card's own reading
    t0 = time.monotonic()
    with pytest.raises(cards.CardError) as e:
        cards.load(path)
    assert time.monotonic() - t0 < 2.0
    assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value), e.value


def test_the_shipped_cards_are_far_below_the_bounds():
    for name in cards.names():
        card = cards.load(name)
        for blocks in card.grids.values():
            assert sum(len(b.shapes) for b in blocks) * 100 < cards.MAX_GRID_POINTS


# --- 12. report: a notebook whose kernel dies -------------------------------------------------------------------

def _dying_papermill(monkeypatch, deaths: dict[str, int]) -> list[str]:
    papermill = pytest.importorskip("papermill")
    from nbclient.exceptions import DeadKernelError

    ran = []

    def execute(inp, outp, **kw):
        name = Path(inp).stem
        ran.append(name)
        if deaths.get(name, 0) > 0:
            deaths[name] -= 1
            raise DeadKernelError("Kernel died")
        Path(outp).write_text(Path(inp).read_text())

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    return ran


FIXTURE = Path(__file__).parent / "fixtures" / "sweeps"


def test_a_page_whose_kernel_died_once_is_run_again(tmp_path, monkeypatch, capsys):
    from splitlab import report

    ran = _dying_papermill(monkeypatch, {"waves": 1})
    index = report.build_report(FIXTURE, tmp_path / "out", only=["waves", "seeds"], allow_fake=True)
    assert ran == ["waves", "waves", "seeds"] and index.is_file()
    assert "waves: DeadKernelError: Kernel died; running it once more" in capsys.readouterr().err


def test_a_page_whose_kernel_keeps_dying_is_named_and_the_others_are_built(tmp_path, monkeypatch):
    from splitlab import report

    ran = _dying_papermill(monkeypatch, {"waves": 5})
    with pytest.raises(SplitlabError) as e:
        report.build_report(FIXTURE, tmp_path / "out", only=["waves", "seeds"], allow_fake=True, progress=False)
    assert ran == ["waves", "waves", "seeds"]
    assert "notebook(s) failed: waves: DeadKernelError: Kernel died (2 times)" in str(e.value)
    assert "\n" not in str(e.value) and "seeds:" not in str(e.value)
    assert (tmp_path / "out" / "seeds.html").is_file() and (tmp_path / "out" / "index.html").is_file()
