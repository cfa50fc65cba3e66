"""``splitlab report -p NAME=VALUE``: notebook parameters from the command line, typed and checked before anything runs.

    splitlab report --only waves -p devices='[b200, mi300x]' -p ctx_len=32k

Each ``-p`` goes to every selected notebook whose ``parameters`` cell declares NAME (``papermill``'s inspection of
the jupytext source). VALUE is read as YAML (``yaml.safe_load``), so ``[b200, mi300x]`` arrives as a list and ``32``
as an int, and is held to the type the notebook declares: a ``str`` parameter takes the text as written (``-p
timer=`` is the empty string), an ``int`` one also a size (``32k``, ``splitlab.args.parse_size``), a ``list`` one
only a list (``-p devices=b200`` would be iterated letter by letter: refused). A NAME no selected notebook declares,
a value of another type, and the parameters ``splitlab report`` sets from its own flags (``FLAG_PARAMETERS``) are
each one ``SplitlabError`` naming the flag; ``splitlab`` prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
import difflib
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from splitlab.args import parse_size, shown
from splitlab.errors import SplitlabError

#: Notebook parameters ``splitlab report`` sets from its own flags; ``-p`` may not set them behind the flag's back
#: (the index would describe other data than the pages show).
FLAG_PARAMETERS = {"data": "--data", "allow_fake": "--allow-fake"}
#: The Python types a declared parameter type (papermill's ``inferred_type_name``) takes; others take any value.
TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "list": (list,),
                                      "dict": (dict,)}
EXAMPLE = "devices='[b200, mi300x]'"
#: Bounds on a ``-p`` value, held before it is read or walked: its text, and the items of the value YAML makes of it
#: (an alias counts each time it is used: ``&a [...]``, ``[*a, *a, ...]`` nest to billions of items in a few hundred
#: characters) and their depth. A notebook parameter is a few names or numbers.
MAX_VALUE_CHARS = 10_000
MAX_VALUE_ITEMS = 1_000
MAX_VALUE_DEPTH = 16


def parameter_text(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as ``(NAME, VALUE)``, VALUE still text (an ``argparse`` type for ``-p``): NAME must be a
    Python identifier."""
    name, sep, value = str(text).partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected NAME=VALUE with NAME a notebook "
                                         f"parameter, e.g. {EXAMPLE}")
    return name, value


def _too_big(value: Any) -> str | None:
    """Why ``value`` is too large to walk (more than ``MAX_VALUE_ITEMS`` items, aliases counted each time they are
    used, or nested deeper than ``MAX_VALUE_DEPTH``), or None; never walks more than that many items (a value that
    holds itself too)."""
    stack, seen = [(value, 0)], 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUE_ITEMS:
            return f"holds more than {MAX_VALUE_ITEMS} items (YAML aliases counted each time they are used)"
        if depth > MAX_VALUE_DEPTH:
            return f"is nested more than {MAX_VALUE_DEPTH} levels deep"
        if isinstance(v, list | tuple):
            stack.extend((x, depth + 1) for x in v[: MAX_VALUE_ITEMS + 1])
        elif isinstance(v, dict):
            stack.extend((x, depth + 1) for kv in list(v.items())[: MAX_VALUE_ITEMS + 1] for x in kv)
    return None


def _plain(value: Any) -> bool:
    """Whether ``value`` is what a notebook's parameter cell can hold as a literal: None, bool, int, float, str, and
    lists and string-keyed dicts of them."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def typed(name: str, text: str, notebook: str, declared: str | None) -> Any:
    """``-p name=text`` for ``notebook``, whose parameter ``name`` is declared of type ``declared`` (papermill's
    ``inferred_type_name``: ``str``, ``int``, ``list``, ...; None or another name: any type), as the value the
    notebook gets (see the module docstring); ``SplitlabError`` naming ``-p`` when it cannot take it."""
    import yaml

    flag = f"-p {name}={shown(text)}"
    if len(text) > MAX_VALUE_CHARS:
        raise SplitlabError(f"{flag} is not allowed: {len(text)} characters; expected a value of at most "
                            f"{MAX_VALUE_CHARS}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except (yaml.YAMLError, RecursionError) as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise SplitlabError(f"{flag} is not YAML ({problem}); expected a YAML value, e.g. {EXAMPLE}") from None
    too_big = _too_big(value)
    if too_big is not None:
        raise SplitlabError(f"{flag} is not allowed: the value YAML makes of it {too_big}; expected at most "
                            f"{MAX_VALUE_ITEMS} items, {MAX_VALUE_DEPTH} levels deep")
    if declared == "str":
        return value if isinstance(value, str) else text
    if declared == "int" and isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError:
            pass
    allowed = TYPES.get(declared or "")
    if allowed is not None and (not isinstance(value, allowed)
                                or (isinstance(value, bool) and bool not in allowed)):
        article = "an" if declared[0] in "aeiou" else "a"
        raise SplitlabError(f"{flag} is not allowed: {notebook} takes {article} {declared} for {name}, this is a "
                            f"{type(value).__name__}; expected {article} YAML {declared}"
                            + (f", e.g. {name}='[{text.strip()}]'" if declared == "list" else ""))
    if not _plain(value):
        raise SplitlabError(f"{flag} is not allowed: YAML reads it as a {type(value).__name__}; expected a number, "
                            "a string, a list or a mapping (quote a string: -p name=\"'2026-01-01'\")")
    return value


def declared_parameters(names: Sequence[str], src_dir: Path) -> dict[str, dict[str, dict]]:
    """Per notebook of ``names`` (``<src_dir>/<name>.py``, jupytext), the parameters its ``parameters`` cell
    declares, as ``papermill.inspect_notebook`` reports them (name -> ``inferred_type_name``, ``default``, ...)."""
    import jupytext
    import nbformat
    import papermill

    out = {}
    with tempfile.TemporaryDirectory(prefix="splitlab-parameters-") as tmp:
        for name in names:
            src = Path(src_dir) / f"{name}.py"
            if not src.is_file():
                raise SplitlabError(f"notebook {name!r}: {src} does not exist")
            path = Path(tmp) / f"{name}.ipynb"
            nbformat.write(jupytext.read(src), path)
            out[name] = dict(papermill.inspect_notebook(str(path)))
    return out


def notebook_arguments(names: Sequence[str], src_dir: Path, texts: Mapping[str, str] | None = None,
                       parameters: Mapping[str, Mapping[str, Any]] | None = None, *,
                       declared: Mapping[str, Mapping[str, dict]] | None = None) -> dict[str, dict[str, Any]]:
    """Per notebook of ``names``, the parameters given to it beyond the report's own: each ``texts`` item (``-p``,
    typed per notebook: ``typed``) for every notebook that declares it, then ``parameters[name]`` (typed values
    from Python, which win). Checked before any notebook runs: ``SplitlabError`` for a ``-p`` name no notebook of
    ``names`` declares (with the names they do), one of ``FLAG_PARAMETERS``, a value of the wrong type, or a
    ``parameters`` name its notebook does not declare. ``declared``: ``declared_parameters(names, src_dir)`` where
    the caller has it, else inspected here. Nothing given: nothing inspected, ``{}``."""
    texts, parameters = dict(texts or {}), {n: dict(p) for n, p in (parameters or {}).items() if n in names}
    if not texts and not parameters:
        return {}
    for name in texts:
        if name in FLAG_PARAMETERS:
            raise SplitlabError(f"-p {name}=... is not allowed; expected the flag {FLAG_PARAMETERS[name]} (the "
                                "report's index describes the data it names)")
    if declared is None:
        declared = declared_parameters(names, src_dir)
    every = sorted({p for d in declared.values() for p in d} - set(FLAG_PARAMETERS))
    for name in texts:
        if not any(name in d for d in declared.values()):
            close = difflib.get_close_matches(name, every, n=1)
            raise SplitlabError(f"-p {name}: no selected notebook ({', '.join(names)}) takes {name}"
                                + (f" (did you mean {close[0]}?)" if close else "")
                                + f"; expected one of {', '.join(every)}")
    for nb, given in parameters.items():
        unknown = [k for k in given if k not in declared[nb]]
        if unknown:
            raise SplitlabError(f"parameters[{nb!r}] names {', '.join(unknown)}; {nb} takes {', '.join(declared[nb])}")
    out: dict[str, dict[str, Any]] = {}
    for nb in names:
        args = {k: typed(k, t, nb, declared[nb][k].get("inferred_type_name")) for k, t in texts.items()
                if k in declared[nb]}
        args.update(parameters.get(nb, {}))
        if args:
            out[nb] = args
    return out
