"""The shipped result sets, by name: the catalog ``data/catalog.toml``, parsed into entries and folders.

Every shipped set has an entry there: its folder, its sweeps, its roles (``current``: what ``splitlab report``
shows by default; ``fit`` / ``held-out``: what ``splitlab.fit`` fits on and scores; ``confirm``: fresh shapes swept
after the rule was final; ``peers``: splitlab's kernels beside the peer libraries' on the same shapes; ``study``:
a question the rule does not answer yet (ragged batches), read by no default; ``archive``: superseded), device,
kernel version, timer and rotation, the command that made it and its purpose. The rest of splitlab takes its default
sets from here, so adding a set is one entry. The catalog only names folders; ``splitlab.results`` reads them
(``results.load`` resolves a name through ``sources`` here, never the other way round)::

    from splitlab import catalog, results
    catalog.names("confirm")          # ['h200-confirm']
    catalog.current().name            # 'h200': the newest kernel version of every family on the H200
    results.load("h200")              # a catalog name loads the set's sweeps; a path loads the path
    results.load("confirm")           # a role loads every set with that role

A name is a string without a path separator that the catalog holds as a set's name or a role; anything else is a
path (``./h200`` is the folder ``h200`` of the current directory even where a set has that name).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from splitlab import resources
from splitlab.errors import SplitlabError

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = resources.data_dir()  # the repository's data/, or the sets a wheel carries (splitlab/_data)
CATALOG = DATA_DIR / "catalog.toml"
ROLES = ("current", "fit", "held-out", "confirm", "peers", "study", "archive")
_SET_KEYS = {"path", "sweeps", "roles", "device", "gpu", "kernel_version", "timer", "rotation", "command", "purpose"}
_BENCH_KEYS = {"path", "roles", "gpu", "kernel_version", "commit", "command", "purpose"}


@dataclass(frozen=True)
class Entry:
    """One result set of the catalog (``[sets.NAME]``) or one bench run (``[bench.NAME]``)."""

    name: str
    path: Path  # absolute
    roles: tuple[str, ...]
    kernel_version: int
    command: str
    purpose: str
    sweeps: tuple[str, ...] = ()  # the set's sweep folders in ``path``; empty: every sweep under it
    device: str = ""  # the device preset the sweeps name (sweep.json: device.name)
    gpu: str = ""
    timer: tuple[str, ...] = ()
    rotation: str = ""
    commit: str = ""

    def sources(self) -> list[Path]:
        """The folders this set's rows are read from: its sweep folders, or its folder."""
        return [self.path / s for s in self.sweeps] if self.sweeps else [self.path]


@dataclass(frozen=True)
class Catalog:
    """The parsed catalog: result sets and bench runs by name, in file order."""

    sets: dict[str, Entry]
    bench: dict[str, Entry]


def _entry(name: str, raw: dict, where: Path, table: str, allowed: set[str], data_dir: Path) -> Entry:
    def bad(key: str, what: str) -> SplitlabError:
        return SplitlabError(f"{where}: [{table}.{name}] {key} {what}")

    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise bad(unknown[0], f"is not allowed; expected keys among {', '.join(sorted(allowed))}")
    for key in ("path", "command", "purpose"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise bad(key, "is missing or not a string; every entry names its folder, command and purpose")
    roles = raw.get("roles")
    if not isinstance(roles, list) or not roles or any(r not in ROLES for r in roles):
        raise bad("roles", f"= {roles!r} is not allowed; expected a list of {', '.join(ROLES)}")
    if not isinstance(raw.get("kernel_version"), int):
        raise bad("kernel_version", "is missing or not an integer")
    if "/" in name or os.sep in name or name in ROLES:
        raise SplitlabError(f"{where}: [{table}.{name!r}] is not allowed; a name has no path separator and is no "
                            f"role ({', '.join(ROLES)})")
    sweeps = raw.get("sweeps", [])
    if not isinstance(sweeps, list) or any(not isinstance(s, str) or not s for s in sweeps):
        raise bad("sweeps", f"= {sweeps!r} is not allowed; expected a list of sweep folder names")
    for key, value in (("path", raw["path"]), *(("sweeps", s) for s in sweeps)):
        if _escapes(value):
            raise bad(key, f"= {value!r} is not allowed; expected a folder inside {data_dir} (a relative path "
                      "without '..')")
    return Entry(name=name, path=data_dir / raw["path"], roles=tuple(roles), kernel_version=raw["kernel_version"],
                 command=raw["command"], purpose=" ".join(raw["purpose"].split()), sweeps=tuple(raw.get("sweeps", ())),
                 device=raw.get("device", ""), gpu=raw.get("gpu", ""), timer=tuple(raw.get("timer", ())),
                 rotation=raw.get("rotation", ""), commit=raw.get("commit", ""))


def _escapes(text: str) -> bool:
    """Whether a catalog path could lead out of the data folder: absolute, from the home folder, or with a ``..``."""
    p = Path(text)
    return p.is_absolute() or text.startswith("~") or ".." in p.parts or ".." in Path(text.replace("\\", "/")).parts


def read(path: str | Path | None = None) -> Catalog:
    """The catalog at ``path`` (default ``CATALOG``, ``data/catalog.toml``); empty when the file does not exist
    (splitlab installed without its data). A malformed catalog is one ``SplitlabError`` naming the file and the
    key: one that is empty or holds no table (cut short), is not valid TOML (the line where it breaks off), or
    whose ``path`` or ``sweeps`` lead out of the catalog's folder (absolute, ``~`` or ``..``)."""
    path = Path(path) if path is not None else CATALOG
    if not path.is_file():
        return Catalog({}, {})
    st = path.stat()
    return _read(path, st.st_mtime_ns, st.st_size)  # read again once the file changed


@cache
def _read(path: Path, mtime_ns: int, size: int) -> Catalog:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SplitlabError(f"{path}: not a readable TOML catalog ({e}); expected the catalog of result sets") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # the message ends "(at line N, column M)": where it broke off
        raise SplitlabError(f"{path}: not a readable TOML catalog: not valid TOML ({e}); expected the catalog of "
                            "result sets (a truncated file: restore it)") from None
    if not raw.get("sets") and not raw.get("bench"):
        what = "is empty" if not text.strip() else "holds no [sets.NAME] or [bench.NAME] table"
        raise SplitlabError(f"{path}: the catalog {what}; expected the catalog of result sets (a truncated file: "
                            "restore it)")
    for table in ("sets", "bench"):
        tables = raw.get(table, {})
        if not isinstance(tables, dict) or any(not isinstance(v, dict) for v in tables.values()):
            raise SplitlabError(f"{path}: [{table}] is not allowed; expected tables [{table}.NAME]")
    sets = {n: _entry(n, v, path, "sets", _SET_KEYS, path.parent) for n, v in raw.get("sets", {}).items()}
    bench = {n: _entry(n, v, path, "bench", _BENCH_KEYS, path.parent) for n, v in raw.get("bench", {}).items()}
    return Catalog(sets, bench)


def entries(role: str | None = None) -> list[Entry]:
    """The result sets (``role``: those with that role), in catalog order."""
    if role is not None and role not in ROLES:
        raise SplitlabError(f"role={role!r} is not allowed; expected one of {', '.join(ROLES)}")
    return [e for e in read().sets.values() if role is None or role in e.roles]


def names(role: str | None = None) -> list[str]:
    """The names of ``entries(role)``."""
    return [e.name for e in entries(role)]


def get(name: str) -> Entry:
    """The result set called ``name``; an unknown name is one ``SplitlabError`` listing the known ones."""
    sets = read().sets
    if name not in sets:
        known = ", ".join(sets) or ("none: " + (f"{CATALOG} does not exist" if not CATALOG.is_file() else
                                                  f"{CATALOG} holds no [sets.NAME] table"))
        raise SplitlabError(f"data set {name!r} is not in the catalog; expected a path or one of {known}")
    return sets[name]


def current(device: str | None = None) -> Entry:
    """The current set (of ``device``, a preset name, when the catalog holds several devices' current sets)."""
    if not CATALOG.is_file():  # an installed package: the shipped sets stay in the repository
        raise SplitlabError(f"no result set given, and no catalog of shipped sets here ({CATALOG} does not exist: "
                            "splitlab runs outside its checkout); expected --data DIR, a folder of splitlab sweeps")
    found = [e for e in entries("current") if device is None or e.device == device]
    if len(found) != 1:
        where = f" for device={device!r}" if device else ""
        raise SplitlabError(f"{CATALOG}: {len(found)} sets have the role current{where}; expected one")
    return found[0]


def why_none(role: str) -> str:
    """Why the catalog names no set with ``role``, for a message: the file is missing (splitlab runs outside its
    checkout), or it holds none (a malformed file is refused by ``read`` before this is asked)."""
    if not CATALOG.is_file():
        return f"{CATALOG} does not exist: splitlab runs outside its checkout"
    return f"{CATALOG} holds no set with the role {role}"


def confirm_for(entry: Entry) -> list[Entry]:
    """The confirm sets of ``entry``'s device, in catalog order."""
    return [e for e in entries("confirm") if e.device == entry.device]


def peers_for(entry: Entry) -> list[Entry]:
    """The peers sets of ``entry``'s device, in catalog order: the comparison first, then its repeats."""
    return [e for e in entries("peers") if e.device == entry.device]


def is_name(data: object) -> bool:
    """Whether ``data`` names catalog sets: a string without a path separator that is a set's name or a role
    (``ROLES``: every set with that role)."""
    return (isinstance(data, str) and "/" not in data and os.sep not in data
            and (data in read().sets or data in ROLES))


def sources(data: str | Path) -> list[Path]:
    """The folders ``data`` names: a catalog set's sweep folders, those of every set with a role
    (``"confirm"``), else ``data`` as a path."""
    if not is_name(data):
        return [Path(data)]
    return [src for e in (entries(str(data)) if data in ROLES else [get(str(data))]) for src in e.sources()]



def sets_of(data: str | Path) -> list[Entry]:
    """The catalog sets ``data`` is or holds: by name (that set), by role (every set with it), or by path (the sets
    whose folders are the path, lie under it or hold it: a set's folder, one of its sweep folders, a folder of
    sets), paths compared resolved (a symbolic link to a set's folder is that set); none for data outside the
    catalog. A relative path is taken from the current folder."""
    if is_name(data):
        return entries(str(data)) if data in ROLES else [get(str(data))]
    try:
        p = Path(data).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return []
    found = []
    for e in entries():
        try:
            srcs = [s.resolve() for s in e.sources()]
        except (OSError, RuntimeError):
            continue
        if any(s == p or p in s.parents or s in p.parents for s in srcs):
            found.append(e)
    return found


def set_at(data: str | Path) -> Entry | None:
    """The one catalog set ``data`` names: by name, or by path (its folder, resolved, when the set is that whole
    folder, or its one sweep folder); None otherwise (a role, a folder of several sets, data outside the
    catalog)."""
    if is_name(data):
        return None if data in ROLES else get(str(data))
    try:
        p = Path(data).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    for e in entries():
        try:
            if [s.resolve() for s in e.sources()] == [p]:
                return e
        except (OSError, RuntimeError):
            continue
    return None


def peers_of(data: str | Path) -> list[Entry] | None:
    """The sets whose role is to compare splitlab's kernels with their peers, for ``data``: where ``data`` is catalog
    data (``sets_of``: a set by name or by path, a role, a folder of sets or inside one) of one device, that
    device's peers sets (``peers_for``: the comparison first, then its repeats; empty where the catalog has none
    for it, or the data span several devices); None for data outside the catalog (whose own peers, if any, are
    theirs to compare)."""
    found = sets_of(data)
    if not found:
        return None
    devices = {e.device for e in found}
    return peers_for(found[0]) if len(devices) == 1 else []


def bench(name: str) -> Entry:
    """The bench run or study folder called ``name`` (``[bench.NAME]``); an unknown name is one ``SplitlabError``
    listing the known ones."""
    runs = read().bench
    if name not in runs:
        raise SplitlabError(f"bench run {name!r} is not in the catalog; expected one of {', '.join(runs) or 'none'}")
    return runs[name]
