"""Every kernel family (``splitlab.families``) has every step of docs/extending.md: its import paths resolve, its card
exists and names what the record names, its launch facts set its knobs, the planner's per-family tables and the
shipped constants cover its kind, its peers' cards exist, its tests exist; the guide names each step's file. A record
that misses a step fails with a line naming the step's file (``problems``: shown failing on records made to miss
one). The old hand-written tables are views of the records, and no module keeps a table of its own."""

from __future__ import annotations

import ast
import inspect
import tomllib
from dataclasses import fields, replace
from pathlib import Path

import pytest

from splitlab import devices, families, resources, workloads
from splitlab.errors import SplitlabError
from splitlab.families import Family, Peer

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "extending.md"

#: The files a family touches, as docs/extending.md names them (``<module>``, ``<name>``, ``<kind>``: the family's),
#: and those a kind of a new shape touches besides.
STEPS = ("splitlab/kernels/<module>.py", "splitlab/kernels/reference.py", "splitlab/kernels/__init__.py",
         "kernels/<name>.toml", "splitlab/families.py", "splitlab/planners/splitlab.py",
         "splitlab/planners/constants/h200-sxm.toml", "tests/test_kernels_<kind>.py", "tests/test_hostile_kernels.py")
SHAPE_STEPS = ("splitlab/workloads.py", "splitlab/waves.py", "splitlab/kernels/inputs.py")
#: The planner's tables of cost-model terms, one entry per kind (``splitlab.planners.splitlab``).
COST_TABLES = ("MAX_SPLITS", "V0_MAX_SPLITS", "MIN_KEYS_PER_SPLIT", "CTAS_PER_SM", "KEYS_FIXED", "REQUEST_MAJOR")
SHIPPED_CONSTANTS = "splitlab/planners/constants/h200-sxm.toml"


def _resolve(path: str):
    from splitlab.bench.impls import resolve

    return resolve(path)


def _card_text(card: str) -> dict | None:
    path = resources.cards_dir() / f"{card}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def problems(f: Family, root: Path = REPO) -> list[str]:
    """What ``f`` misses of the steps of adding a family, one line each naming the step's file; empty: none."""
    from splitlab.bench import cards, grid
    from splitlab.planners import fitted, registry
    from splitlab.planners import names as planner_names
    from splitlab.planners import splitlab as rule
    from splitlab.planners.registry import Plan

    out: list[str] = []
    found = {}
    for key in ("launcher", "reference", "launch_facts", "worklist"):  # step 1-2: the kernel and its reference
        path = getattr(f, key)
        if path is None:
            continue
        try:
            found[key] = _resolve(path)
        except SplitlabError as e:
            out.append(f"{f.name}: {key} does not resolve (splitlab/kernels/): {e}")
            continue
        if not callable(found[key]):
            out.append(f"{f.name}: {key}={path!r} is not callable (splitlab/kernels/)")

    import splitlab.kernels as kernels_pkg  # step 3: the package exports the launcher and its launch facts

    for key in ("launcher", "launch_facts"):
        attr = getattr(f, key).partition(":")[2]
        if attr not in getattr(kernels_pkg, "__all__", ()):
            out.append(f"{f.name}: splitlab/kernels/__init__.py does not export {attr} ({key})")

    raw = _card_text(f.card)  # step 4: the card, naming what the record names
    if raw is None:
        out.append(f"{f.name}: its card kernels/{f.card}.toml does not exist")
    else:
        impl, knobs = raw.get("impl", {}), raw.get("knobs", {})
        want = {"name": (raw.get("name"), f.name), "kind": (raw.get("kind"), f.kind),
                "impl.type": (impl.get("type", "kernel"), "kernel"), "impl.import": (impl.get("import"), f.launcher),
                "impl.reference": (impl.get("reference"), f.reference),
                "impl.launch_facts": (impl.get("launch_facts"), f.launch_facts),
                "[knobs] (of the record's knobs)": (sorted(set(f.knobs) & set(knobs)), sorted(f.knobs)),
                "num_splits' max (max_splits)": (knobs.get("num_splits", {}).get("max"), f.max_splits)}
        for key, (card_has, record_has) in want.items():
            if card_has != record_has:
                out.append(f"{f.name}: kernels/{f.card}.toml {key} is {card_has!r}, the record (splitlab/families.py) "
                           f"{record_has!r}")
        if not out:
            try:
                c = cards.load(f.card)
            except SplitlabError as e:
                out.append(f"{f.name}: kernels/{f.card}.toml does not load: {e}")
            else:  # its launch facts set every knob the record lists, for a shape of its quick grid
                w = grid.expand(c, "quick", "h200").points[0].workload
                facts = found["launch_facts"](w, device=devices.get("h200"))
                unset = [k for k in f.knobs if getattr(facts, k, None) is None]
                if unset:
                    out.append(f"{f.name}: {f.launch_facts} leaves {', '.join(unset)} unset (splitlab/kernels/)")
                takes = set(inspect.signature(found["launch_facts"]).parameters)
                plan_fields = {x.name for x in fields(Plan)}
                bad = [t for t in f.plan_tiles if t not in takes or t not in plan_fields or t not in f.knobs]
                if bad:
                    out.append(f"{f.name}: plan_tiles {', '.join(bad)} are not Plan fields its launch facts take "
                               "(splitlab/families.py)")
    if "launcher" in found:  # the launcher's split limit is the record's
        limit = getattr(inspect.getmodule(found["launcher"]), "MAX_SPLITS", f.kernel_max_splits)
        if limit != f.kernel_max_splits:
            out.append(f"{f.name}: {f.module}.MAX_SPLITS is {limit}, the record's kernel_max_splits "
                       f"{f.kernel_max_splits} (splitlab/families.py)")

    for table in COST_TABLES:  # step 6: the cost model's terms
        if f.kind not in getattr(rule, table):
            out.append(f"{f.name}: splitlab/planners/splitlab.py {table} has no {f.kind!r}")
    if f.kind not in registry.KERNEL_MAX_SPLITS or f.kind not in fitted.MAX_SPLITS:
        out.append(f"{f.name}: planners.registry.KERNEL_MAX_SPLITS / planners.fitted.MAX_SPLITS have no {f.kind!r} "
                   "(views of splitlab/families.py)")
    if f.kind in workloads.KINDS and "splitlab" not in planner_names(f.kind):
        out.append(f"{f.name}: the splitlab planner (splitlab/planners/splitlab.py) does not cover {f.kind!r}")
    shipped = fitted.shipped()  # step 7: the shipped constants hold the kind
    if not shipped or any(f.kind not in fc.families for fc in shipped.values()):
        out.append(f"{f.name}: {SHIPPED_CONSTANTS} has no [{f.kind}] table (splitlab fit --out)")

    for p in f.peers:  # the peers' cards, of the family's kind, with its peers grid
        peer = _card_text(p.card)
        if peer is None:
            out.append(f"{f.name}: peer {p.role!r}: its card kernels/{p.card}.toml does not exist")
        elif peer.get("kind") != f.kind or "peers" not in peer.get("grids", {}):
            out.append(f"{f.name}: peer {p.role!r}: kernels/{p.card}.toml is not of kind {f.kind!r} with a peers grid")
    if f.peers and raw is not None and "peers" not in raw.get("grids", {}):
        out.append(f"{f.name}: kernels/{f.card}.toml has peers but no peers grid")

    tests = root / f.test_file  # step 8-9: its tests
    if not tests.is_file():
        out.append(f"{f.name}: {f.test_file} does not exist")
    else:
        text = tests.read_text(encoding="utf-8")
        for key in ("launcher", "reference"):
            if getattr(f, key).partition(":")[2] not in text or "reference" not in text:
                out.append(f"{f.name}: {f.test_file} does not call its {key} ({getattr(f, key)})")
    hostile = root / "tests" / "test_hostile_kernels.py"
    if f.launcher.partition(":")[2] not in hostile.read_text(encoding="utf-8"):
        out.append(f"{f.name}: tests/test_hostile_kernels.py has no entry for {f.launcher}")
    return out


@pytest.mark.parametrize("family", families.ALL, ids=families.names())
def test_every_family_has_every_step(family):
    assert problems(family) == []


GQA, MLA, SPARSE = (families.get(n) for n in ("gqa_decode", "mla_decode", "sparse_mla_decode"))
NEW_KIND = replace(GQA, name="nsa_decode", kind="nsa", card="nsa_decode")


@pytest.mark.parametrize(("record", "expected"), [
    (replace(GQA, card="no_such_card"), ["kernels/no_such_card.toml does not exist"]),
    (replace(GQA, launcher="splitlab.kernels.gqa:no_such_launcher"), ["launcher does not resolve", "impl.import"]),
    (replace(GQA, worklist="splitlab.kernels.worklist:no_such"), ["worklist does not resolve"]),
    (replace(MLA, reference="splitlab.kernels.reference:gqa_decode"), ["impl.reference is"]),
    (replace(SPARSE, knobs=(*SPARSE.knobs, "num_stages")), ["[knobs] (of the record's knobs) is"]),
    (replace(GQA, max_splits=64), ["num_splits' max (max_splits) is 128"]),
    (replace(MLA, plan_tiles=("block_k",)), ["plan_tiles block_k"]),
    (replace(MLA, peers=(Peer("X", "no_such_peer", "only"),)), ["kernels/no_such_peer.toml does not exist"]),
    (replace(GQA, peers=(Peer("FlashMLA", "flashmla_decode", "only"),)), ["not of kind 'gqa'"]),
    (NEW_KIND, ["kernels/nsa_decode.toml does not exist", "CTAS_PER_SM has no 'nsa'", "REQUEST_MAJOR has no 'nsa'",
                "KERNEL_MAX_SPLITS", f"{SHIPPED_CONSTANTS} has no [nsa]", "tests/test_kernels_nsa.py does not exist"]),
], ids=["no card", "launcher", "worklist", "reference", "knobs", "max_splits", "plan_tiles", "peer card",
        "peer kind", "a new kind"])
def test_a_family_missing_a_step_fails_naming_it(record, expected):
    found = problems(record)
    for text in expected:
        assert any(text in p for p in found), (text, found)


def test_the_guide_names_every_step_and_counts_them():
    guide = GUIDE.read_text(encoding="utf-8")
    for path in (*STEPS, *SHAPE_STEPS, *COST_TABLES):
        assert path in guide, f"docs/extending.md does not name {path}"
    n = len(STEPS)
    assert f"**Files: {n}**" in guide and f"**{n + len(SHAPE_STEPS)} where the kind's shape is new**" in guide
    for section in ("## A kernel family", "## A planner", "## A peer", "## A notebook"):
        assert section in guide


# --- the record table and its lookups ------------------------------------------------------------------------

def test_lookups():
    assert families.names() == ["gqa_decode", "mla_decode", "sparse_mla_decode"]
    assert families.kinds() == ("gqa", "mla", "sparse_mla")
    assert families.get("mla_decode").kind == "mla" and families.by_kind("sparse_mla").name == "sparse_mla_decode"
    assert GQA.module == "splitlab.kernels.gqa" and SPARSE.test_file == "tests/test_kernels_sparse_mla.py"
    for bad, call in (("flashinfer_decode", families.get), ("gqa_decode", families.by_kind)):
        with pytest.raises(SplitlabError, match="is not allowed; expected one of"):
            call(bad)


@pytest.mark.parametrize(("records", "message"), [
    ((GQA, replace(MLA, name="gqa_decode")), "name 'gqa_decode' given twice"),
    ((GQA, replace(MLA, kind="gqa")), "kind 'gqa' given twice"),
    ((replace(GQA, reference="splitlab.kernels.reference.gqa_decode"),), "reference="),
    ((replace(GQA, peers=(Peer("x", "sdpa_flash", "fastest"),)),), "pick='fastest'"),
])
def test_check_refuses_a_table_that_cannot_be_looked_up(records, message):
    with pytest.raises(SplitlabError, match=message):
        families.check(records)
    families.check(families.ALL)


def test_the_old_tables_are_views_of_the_records():
    from splitlab import headline
    from splitlab.planners import fitted, registry

    assert workloads.KINDS == families.kinds()
    assert workloads.KERNEL_KINDS == {"gqa_decode": "gqa", "mla_decode": "mla", "sparse_mla_decode": "sparse_mla"}
    assert headline.FAMILIES == {"gqa_decode": "GQA", "mla_decode": "MLA", "sparse_mla_decode": "sparse MLA"}
    assert fitted.MAX_SPLITS == {"gqa": 128, "mla": 256, "sparse_mla": 64}
    assert registry.KERNEL_MAX_SPLITS == {"gqa": 65535, "mla": 65535, "sparse_mla": 65535}
    assert workloads.get("deepseek-v3-mla").page_size == 64 and workloads.get("llama-3-8b").page_size == 16


def test_no_module_keeps_its_own_table_of_the_families():
    """Outside ``families.py`` (and the kernels, which name themselves in their messages) no dict is keyed by two or
    more family names: such a table is a view of the records (a comprehension), or a lookup."""
    names = set(families.names())
    found = []
    for path in sorted((REPO / "splitlab").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "splitlab/families.py" or rel.startswith("splitlab/kernels/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(keys & names) >= 2:
                    found.append(f"{rel}:{node.lineno}")
    assert not found, "tables of the families outside splitlab/families.py: " + ", ".join(found)
