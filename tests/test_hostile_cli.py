"""Hostile input to the command lines and the files they read (issue 39, all but the kernels' launchers, which
``tests/test_hostile_kernels.py`` covers): each is refused in one line (``splitlab: error: ...``, exit code 2) or
handled, never a traceback, never a silent wrong answer."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from splitlab import catalog, planners, plugins, workloads
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
