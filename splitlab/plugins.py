"""Plugins: a user's Python module imported before a command runs, so that what it registers takes part.

A plugin is any module: importing it runs its ``splitlab.planners.register(...)`` calls (its planners then answer
``splitlab plan``, are measured by ``splitlab sweep`` beside the built-in ones, and are scored by ``splitlab
regress``), and a kernel card anywhere on disk can name its implementation (``[impl] import = "module:function"``)::

    splitlab --plugin my_planner.py sweep path/to/my_card.toml --grid quick
    SPLITLAB_PLUGINS=my_planner,my_kernels splitlab plan --kind gqa --planner my_rule

Each spec is a module name on the import path (the current folder counts) or a ``.py`` file; a file's folder goes
on ``sys.path`` (first), so a card's ``import`` finds the file as a module by its name, and so does a sweep's point
worker (it takes the session's ``sys.path``). ``examples/`` holds one of each.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from splitlab.errors import SplitlabError

#: Plugins every command imports, comma-separated (before those given with ``--plugin``).
ENV_PLUGINS = "SPLITLAB_PLUGINS"


def specs(given: Sequence[str] = ()) -> list[str]:
    """The plugins to import: ``SPLITLAB_PLUGINS``' then ``given``, each once, in order."""
    env = [s.strip() for s in os.environ.get(ENV_PLUGINS, "").split(",") if s.strip()]
    return list(dict.fromkeys([*env, *given]))


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def _on_path(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)


def import_plugin(spec: str, arg: str = "--plugin") -> ModuleType:
    """Import one plugin (a module name or a ``.py`` file); anything that goes wrong, in the plugin too (an
    exception, or ``sys.exit`` while it is imported: any ``BaseException`` but ``KeyboardInterrupt``), is one
    ``SplitlabError`` naming ``arg`` and the spec."""
    what = "a module name on the import path or a .py file"
    if not spec or "\0" in spec:
        raise SplitlabError(f"{arg}={spec!r} is not allowed; expected {what}")
    if _is_file_spec(spec):
        p = Path(spec).expanduser()
        if p.suffix != ".py":
            raise SplitlabError(f"{arg}={spec!r} is not a .py file; expected {what}")
        if not p.exists():
            raise SplitlabError(f"{arg}={spec!r} does not exist; expected {what}")
        if not p.is_file():
            raise SplitlabError(f"{arg}={spec!r} is not a file; expected {what}")
        name, folder = p.stem, str(p.resolve().parent)
        if not name.isidentifier():
            raise SplitlabError(f"{arg}={spec!r}: {name!r} is not a module name; expected a file named like one "
                                "(letters, digits, _)")
        loaded = sys.modules.get(name)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != p.resolve():
            raise SplitlabError(f"{arg}={spec!r}: a module {name!r} is already imported from "
                                f"{getattr(loaded, '__file__', '?')}; expected a plugin file with another name")
        _on_path(folder)
    else:
        name = spec
    try:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:  # not on the path: the current folder's, as `python -m` would find it
            if e.name != name.split(".")[0] or os.getcwd() in sys.path:
                raise
            sys.path.append(os.getcwd())
            return importlib.import_module(name)
    except SplitlabError as e:
        raise SplitlabError(f"{arg}={spec!r}: {e}") from None
    except KeyboardInterrupt:  # Ctrl-C stays Ctrl-C
        raise
    except BaseException as e:  # the plugin's own code failed, or ended the process (sys.exit) while imported
        raise SplitlabError(f"{arg}={spec!r} cannot be imported: {type(e).__name__}: {e}") from None


def load(given: Sequence[str] = ()) -> list[ModuleType]:
    """Import ``specs(given)`` in order (``SPLITLAB_PLUGINS`` first); returns the modules."""
    env = specs()
    return [import_plugin(s, ENV_PLUGINS if s in env else "--plugin") for s in specs(given)]
