"""Argument checks the command lines share (``splitlab``, ``python -m splitlab.report``, ``python -m splitlab.fit``),
and the flags of ``splitlab fit``, which is also ``python -m splitlab.fit`` (``add_fit_arguments``: here, so that the
command line defines them without importing the fit and its numpy and pandas).

The convention: a bad argument is one line on stderr, ``splitlab: error: <argument>=<value> ...; expected ...``,
and exit code 2; an interrupt (Ctrl-C, SIGTERM) is one line and exit code 130, after the ``finally`` blocks
and context managers have cleaned up (``interrupts_as_keyboard_interrupt``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from splitlab.errors import SplitlabError

#: The longest file-name component most file systems take (bytes).
NAME_MAX = 255
#: Pseudo file systems where no result folder can live.
PSEUDO_FS = ("/proc", "/sys")
#: Exit codes: a refused argument, and an interrupt (128 + SIGINT, as a shell reports it).
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
#: Exit code when stdout's reader went away (as a shell reports SIGPIPE: 128 + 13).
EXIT_BROKEN_PIPE = 141


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` with the one-line error: a parse error raises ``SplitlabError`` (no usage block); a flag it does
    not know is named with the closest flag the command takes (``--worklaod``: did you mean ``--workload``?)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SplitlabError(message)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(self, ns, extras))
        return ns


def _flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
    """The long flags ``parser`` takes, with those of the subcommand ``ns`` chose."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            chosen = a.choices.get(getattr(ns, a.dest, None) or "")
            out += _flags(chosen, ns) if chosen is not None else []
        else:
            out += [s for s in a.option_strings if s.startswith("--")]
    return out


def unrecognized(parser: argparse.ArgumentParser, ns: argparse.Namespace, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" message, with the closest known flag for each unknown one
    (``difflib``), in one line."""
    import difflib

    flags = sorted(set(_flags(parser, ns)))
    hints = []
    for x in extras:
        name = x.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6) if name.startswith("--") else []
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    given = " ".join(extras)
    given = given if len(given) <= 80 else shown(given)  # a 5000-character argument stays readable
    return f"unrecognized arguments: {given}" + (f" ({'; '.join(hints)})" if hints else "") + \
        "; expected the flags `-h` lists"


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, shortened in the middle past ``limit`` characters (a 5000-character path stays readable
    in a one-line message)."""
    r = repr(str(value)) if isinstance(value, Path) else repr(value)
    return r if len(r) <= limit else f"{r[: limit // 2]}...{r[-(limit // 4):]} ({len(str(value))} characters)"


def path_text(arg: str, value: object, what: str) -> str:
    """``value`` as path text, refused (naming ``arg``) when empty, with a NUL, or with a name longer than
    ``NAME_MAX`` bytes."""
    text = str(value) if value is not None else ""
    if not text.strip():
        raise SplitlabError(f"{arg}={shown(text)} is not allowed; expected {what} (not empty)")
    if "\0" in text:
        raise SplitlabError(f"{arg}={shown(text)} is not allowed; expected {what} (no NUL character)")
    for part in Path(text).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise SplitlabError(f"{arg}={shown(text)} is not allowed: a name in it is {len(os.fsencode(part))} "
                                f"bytes long; expected {what} whose every name is at most {NAME_MAX} bytes")
    return text


def _under_pseudo_fs(p: Path) -> str | None:
    try:
        full = p.expanduser().absolute()
    except (OSError, RuntimeError):
        return None
    for root in PSEUDO_FS:
        if full == Path(root) or Path(root) in full.parents:
            return root
    return None


def out_dir(arg: str, value: object, *, create: bool = True) -> Path:
    """Check that ``value`` names a folder splitlab can write into, and return it as a ``Path``.

    Refused, each in one ``SplitlabError`` naming ``arg``: an empty path, a name longer than ``NAME_MAX`` bytes, a
    path that is a file (``/dev/null`` too), one under ``/proc`` or ``/sys``, and (with ``create``) a folder that
    cannot be created or written into. With ``create`` the folder is created and a probe file written and
    removed; without it (a dry run writes nothing) the nearest existing folder above it must be writable."""
    what = "a folder to write into"
    text = path_text(arg, value, what)
    p = Path(text).expanduser()
    root = _under_pseudo_fs(p)
    if root is not None:
        raise SplitlabError(f"{arg}={shown(text)} is not allowed: it is under {root}, a pseudo file system; "
                            f"expected {what}")
    try:
        if p.exists() and not p.is_dir():
            raise SplitlabError(f"{arg}={shown(text)} is a file, not a folder; expected {what}")
        if create:
            p.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".splitlab-write-probe-", dir=p)
            os.close(fd)
            os.unlink(probe)
            return p
        above = p
        while not above.exists() and above != above.parent:
            above = above.parent
        if not above.is_dir():
            raise SplitlabError(f"{arg}={shown(text)} is not allowed: {shown(str(above))} is a file; expected {what}")
        if not os.access(above, os.W_OK | os.X_OK):
            raise SplitlabError(f"{arg}={shown(text)} is not allowed: {shown(str(above))} is not writable; "
                                f"expected {what}")
    except OSError as e:
        raise SplitlabError(f"{arg}={shown(text)} is not a folder splitlab can write into "
                            f"({e.strerror or type(e).__name__}); expected {what}") from None
    return p


def existing_path(arg: str, value: object, what: str = "a sweep folder, a folder of sweeps or a result file") -> Path:
    """Check that ``value`` names an existing file or folder (one ``SplitlabError`` naming ``arg`` otherwise)."""
    text = path_text(arg, value, what)
    p = Path(text).expanduser()
    try:
        if not p.exists():
            raise SplitlabError(f"{arg}={shown(text)} does not exist; expected {what}")
        os.stat(p)
    except OSError as e:
        raise SplitlabError(f"{arg}={shown(text)} cannot be read ({e.strerror or type(e).__name__}); "
                            f"expected {what}") from None
    return p


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) delivered while ``interrupts_as_keyboard_interrupt`` is active."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """While active, SIGTERM and SIGHUP raise ``Interrupted`` (a ``KeyboardInterrupt``) in the main thread, as
    Ctrl-C raises ``KeyboardInterrupt``: ``finally`` blocks and context managers (temporary folders) run before
    the process ends. Outside the main thread it does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    saved = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:  # an ignored one (nohup) stays ignored
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def run_main(prog: str, fn: Callable[[], int], *, cleanup_note: str = "") -> int:
    """Run a command's body with the convention: ``SplitlabError`` -> one line, exit 2; Ctrl-C / SIGTERM ->
    one line, exit 130 (after the body's own cleanup has run)."""
    try:
        with interrupts_as_keyboard_interrupt():
            return fn()
    except SplitlabError as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader left (`splitlab schema | head`): stop writing, without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit goes nowhere
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:
        import logging

        # Tasks the interrupt abandoned (a notebook's dead kernel) would be logged at exit: consequences, not news.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        what = e.args[0] if isinstance(e, Interrupted) else "Ctrl-C"
        print(f"{prog}: interrupted ({what}){cleanup_note}", file=sys.stderr)
        return EXIT_INTERRUPTED


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into one line."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or text


def split_list(arg: str, text: str, what: str) -> list[str]:
    """``a,b,c`` as a list; an empty item (``a,,b``, ``''``) is refused naming ``arg``."""
    items = [x.strip() for x in str(text).split(",")]
    if any(not x for x in items):
        raise SplitlabError(f"{arg}={shown(text)} is not allowed; expected {what}, comma-separated, none empty")
    return items


#: Size suffixes a key count takes on the command line (``32k``, ``128K``, ``1M``): binary, as the figures' "32K".
SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """``text`` as an integer, with an optional size suffix (``SIZE_SUFFIXES``, either case): ``32k`` and ``32K``
    are 32768, ``1M`` 1048576. ``ValueError`` for anything else (``1.5k``, ``k``, ``32kb``)."""
    t = text.strip()
    scale = SIZE_SUFFIXES.get(t[-1:].lower(), 1) if t else 1
    return int(t[:-1] if scale != 1 else t) * scale


def _int_in(text: str, lo: int, hi: int | None, sizes: bool = False) -> int:
    allowed = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
    if sizes:
        allowed += " (sizes like 32k or 1M allowed)"
    try:
        v = parse_size(text) if sizes else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer; expected {allowed}") from None
    if v < lo or (hi is not None and v > hi):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected {allowed}")
    return v


def int_type(lo: int, hi: int | None = None, *, sizes: bool = False) -> Callable[[str], int]:
    """An ``argparse`` type: an integer in ``[lo, hi]`` (``hi`` None: no upper bound); with ``sizes`` (a key count)
    also ``32k``, ``128K``, ``1M`` (``parse_size``)."""
    return lambda text: _int_in(text, lo, hi, sizes)


def int_list_type(lo: int, hi: int, *, sizes: bool = False) -> Callable[[str], list[int]]:
    """An ``argparse`` type: comma-separated integers in ``[lo, hi]`` (``1,2,8``), none empty; with ``sizes``
    also ``32k,128K`` (``parse_size``)."""

    def parse(text: str) -> list[int]:
        parts = [x.strip() for x in text.split(",")]
        if any(not x for x in parts):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected integers in [{lo}, {hi}], "
                                             f"comma-separated (e.g. {'8k,32k' if sizes else '1,2,8'})")
        return [_int_in(x, lo, hi, sizes) for x in parts]

    return parse


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number; expected a finite number > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not allowed; expected a finite number > 0")
    return v


def add_fit_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``splitlab fit`` (and ``python -m splitlab.fit``)."""
    p.add_argument("data", nargs="*",
                   help="result sets: catalog names or sweep folders (default: the catalog's fit sets, read together); "
                   "the first, and those after it read together, which replace the first's rows of every kernel they "
                   "hold")
    p.add_argument("--out", metavar="FILE", help="write the constants, with the device, data, kernel versions and "
                   "scores, to this .toml file (what `splitlab plan --constants` and SPLITLAB_CONSTANTS take)")
    p.add_argument("--confirm", metavar="DATA", action="append",
                   help="also score the fitted rule on a set of shapes in no fit and no held-out set (a catalog name "
                   "or a sweep folder); repeatable (default, without DATA: the catalog's confirm sets)")
    p.add_argument("--head-tiles", metavar="DATA",
                   help="fit sparse MLA's head-tile pass on this set's fit shapes (BLOCK_H 16 against the default "
                   "at every split the rule weighs, e.g. a later kernel version's)")
    p.add_argument("--allow-fake", action="store_true", help="fit modelled rows (the fake timer's) too: for CI; the "
                   "file then says timing = \"modelled\"")
