"""The experiments (experiments/README.md) are checked without a GPU and without running them: every script
byte-compiles; its imports of splitlab name modules and attributes that exist, its imports of sibling scripts name a
file of its own folder that defines the names, and its other imports are the standard library or installed; every
folder's README names the command of each script it runs; and data/ holds no code.

No experiment is imported: its Triton and Gluon kernels may need a GPU or compile on import. Its imports are read
from its syntax tree instead, as are those of Python source it holds in a string (``kernel_ab.py`` builds a module
from one), so that a rename in splitlab fails here with the script, line and missing name."""

import ast
import importlib
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
SCRIPTS = sorted(EXPERIMENTS.rglob("*.py"))
FOLDERS = sorted({p.parent for p in EXPERIMENTS.rglob("*") if p.suffix in (".py", ".sh")})
#: Packages that exist only where the experiments run: the GPU machine's peer libraries and their build kits, put on
#: sys.path there at run time. Their imports are not resolved here; any other import that is neither splitlab, a
#: sibling, the standard library nor installed fails (a misspelt or missing sibling, most likely).
GPU_ONLY = {"flashinfer", "flash_mla", "fmla_peer"}
#: What data/ must not hold: source code of any kind.
CODE = (".py", ".pyx", ".pyc", ".ipynb", ".sh", ".cu", ".cuh", ".c", ".cc", ".cpp", ".h")


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _ids(paths):
    return [_rel(p) for p in paths]


def _imports(tree: ast.AST):
    """(line, statement) of every import in ``tree``, nested ones included, and of every string constant that parses
    as Python holding an import (lines: the string's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node.lineno, node
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                inner = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:  # prose (a docstring), not source
                continue
            for n in ast.walk(inner):
                if isinstance(n, ast.Import | ast.ImportFrom):
                    yield node.lineno + n.lineno - 1, n


def _defined(path: Path) -> set[str] | None:
    """The names ``path`` binds at module level, in if / try / with blocks too (None: it star-imports, so any name
    may be there)."""
    names: set[str] = set()

    def visit(body) -> bool:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
                continue
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return False
            if isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if not all(visit(getattr(node, f, [])) for f in ("body", "orelse", "finalbody", "handlers")):
                return False
        return True

    return names if visit(ast.parse(path.read_text()).body) else None


def _splitlab_module(name: str):
    """(the module, "") or (None, why not): found with find_spec, then imported (splitlab's modules are cheap)."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as e:  # a parent package is missing
        return None, f"no module {e.name!r}"
    if spec is None:
        return None, f"no module {name!r}"
    try:
        return importlib.import_module(name), ""
    except Exception as e:  # any failure to import is the finding
        return None, f"module {name!r} exists but fails to import ({type(e).__name__}: {e})"


def _problems(path: Path) -> list[str]:
    """Every import of ``path`` that does not resolve, one line each: ``FILE:LINE: STATEMENT: why``."""
    out = []
    for line, node in _imports(ast.parse(path.read_text(), filename=str(path))):
        def bad(why, node=node, line=line):
            out.append(f"{_rel(path)}:{line}: {ast.unparse(node)}: {why}")

        if isinstance(node, ast.ImportFrom) and node.level:
            bad("a relative import; experiments are scripts, not packages")
            continue
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        else:
            targets = [(node.module, [a.name for a in node.names])]
        for module, names in targets:
            top = module.split(".")[0]
            if top == "splitlab":
                mod, why = _splitlab_module(module)
                if mod is None:
                    bad(why)
                    continue
                for name in names or []:
                    submodule = hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
                    if name != "*" and not hasattr(mod, name) and not submodule:
                        bad(f"module {module!r} has no attribute or submodule {name!r}")
            elif (path.parent / f"{top}.py").is_file():  # a sibling: a script's own folder is first on sys.path
                if module != top:
                    bad(f"{top}.py is a file, not a package")
                    continue
                have = _defined(path.parent / f"{top}.py")
                missing = [n for n in names or [] if have is not None and n != "*" and n not in have]
                if missing:
                    bad(f"{_rel(path.parent / f'{top}.py')} defines no {', '.join(missing)}")
            elif top in sys.stdlib_module_names or top in GPU_ONLY:
                continue
            elif importlib.util.find_spec(top) is None:
                bad(f"{top!r} is not splitlab, not a file of {_rel(path.parent)}/, not the standard library and not "
                    "installed")
    return out


def _runs_as_script(path: Path) -> bool:
    """Whether ``path`` is run (a ``if __name__ == "__main__":`` block), not only imported by its siblings."""
    return any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) and "__main__" in ast.unparse(n.test)
               for n in ast.parse(path.read_text()).body)


def test_there_are_experiments_to_check():
    assert SCRIPTS and FOLDERS and (EXPERIMENTS / "README.md").is_file()


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_every_experiment_byte_compiles(path):
    compile(path.read_text(), str(path), "exec", dont_inherit=True)


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_every_experiment_import_resolves(path):
    problems = _problems(path)
    assert not problems, "unresolved imports:\n" + "\n".join(problems)


@pytest.mark.parametrize("folder", FOLDERS, ids=_ids(FOLDERS))
def test_every_experiment_folder_has_a_readme_naming_its_commands(folder):
    readme = folder / "README.md"
    assert readme.is_file(), f"{_rel(folder)}/ has no README.md (the question, command, CSVs and answer)"
    text = readme.read_text()
    rel = _rel(folder)
    runs = [f"python {rel}/{p.name}" for p in sorted(folder.glob("*.py")) if _runs_as_script(p)]
    runs += [f"bash {rel}/{p.name}" for p in sorted(folder.glob("*.sh"))]
    assert runs, f"{rel}/ has no script that runs"
    assert [c for c in runs if c not in text] == [], f"{_rel(readme)} does not give these commands"
    # every command a README gives names a script that is there
    named = re.findall(r"(?:python|bash) (experiments/[\w./-]+\.(?:py|sh))", text)
    assert [p for p in named if not (REPO / p).is_file()] == [], f"{_rel(readme)} names scripts that do not exist"


def test_the_index_links_every_experiment_folder():
    index = (EXPERIMENTS / "README.md").read_text()
    linked = {target.split("/")[0] for target in re.findall(r"\]\(([^)#]+)", index)}
    assert {f.relative_to(EXPERIMENTS).parts[0] for f in FOLDERS} <= linked, "experiments/README.md misses a folder"


def test_data_holds_no_code():
    code = [_rel(p) for p in (REPO / "data").rglob("*") if p.is_file() and p.suffix in CODE]
    assert code == [], "data/ holds data only; experiments and their scripts go under experiments/"
