"""The catalog of shipped result sets (``data/catalog.toml``, ``splitlab.catalog``): every entry exists, loads and is
what it says (device, GPU, timer, sweeps); every shipped sweep and bench folder has an entry; the defaults of the
report and the fit come from it; and a malformed catalog is one clear error."""

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from splitlab import catalog, datasets, report, results
from splitlab.errors import SplitlabError

REPO = Path(__file__).resolve().parents[1]
ENTRIES = catalog.entries()
BENCH = list(catalog.read().bench.values())


def _sidecars(entry):
    return [json.loads(p.read_text()) for src in entry.sources() for p in sorted(src.rglob("sweep.json"))]


def test_the_catalog_names_a_current_set_fit_and_confirm_sets():
    assert ENTRIES and BENCH
    cur = catalog.current()
    assert cur.name == "h200" and cur.path == REPO / "data" / "h200"
    assert catalog.names("fit") == ["h200"] and "h200" in catalog.names("held-out")
    assert catalog.names("confirm") == ["h200-confirm"]
    # the current set is the newest kernel version, and every confirm set measures that version on its device
    assert cur.kernel_version == max(e.kernel_version for e in ENTRIES)
    for e in catalog.entries("confirm"):
        assert e.kernel_version == catalog.current(e.device).kernel_version, e.name


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_set_exists_loads_and_has_the_sidecars_it_says(entry):
    for src in entry.sources():
        assert src.is_dir(), src
    sides = _sidecars(entry)
    assert sides, entry.name
    if entry.sweeps:  # each named sweep is one sweep folder, named after its card and grid
        assert len(sides) == len(entry.sweeps)
        assert [f"{s['kernel']}-{s['grid']}" for s in sides] == list(entry.sweeps)
    assert {s["device"]["name"] for s in sides} == {entry.device}, entry.name
    assert {s["env"]["device"]["name"] for s in sides} == {entry.gpu}, entry.name
    assert {s["timer"] for s in sides} == set(entry.timer), entry.name
    assert entry.rotation in ("read", "pool3") and entry.command.startswith(("splitlab sweep", "CUDA_VISIBLE"))
    df = results.load(entry.name)
    assert len(df) == sum(s["rows"] for s in sides), entry.name
    assert set(df["device"].dropna()) == {entry.device}
    assert set(df["status"]) <= set(results.STATUSES)


def test_every_shipped_sweep_belongs_to_exactly_one_set():
    shipped = {p.parent for p in (REPO / "data").rglob("sweep.json")}
    owners = {}
    for e in ENTRIES:
        for src in e.sources():
            for side in src.rglob("sweep.json"):
                owners.setdefault(side.parent, []).append(e.name)
    assert set(owners) == shipped
    assert {k: v for k, v in owners.items() if len(v) != 1} == {}


@pytest.mark.parametrize("entry", BENCH, ids=lambda e: e.name)
def test_every_bench_run_exists_and_says_what_it_is(entry):
    assert entry.path.is_dir(), entry.path
    if "current" in entry.roles:  # a `splitlab bench` run: its points, its summary, its device
        assert {"points.csv", "summary.csv", "env.json"} <= {p.name for p in entry.path.iterdir()}
        assert json.loads((entry.path / "env.json").read_text())["device"] == entry.gpu
    else:  # a folder of older runs and A/B files: its README says what each file is
        assert (entry.path / "README.md").is_file() or any(entry.path.glob("*/env.json")), entry.path


def test_every_bench_folder_is_catalogued():
    runs = {p.parent for p in (REPO / "data").rglob("env.json") if not (p.parent / "sweep.json").exists()}
    covered = [e.path for e in BENCH]
    assert [r for r in runs if not any(r == c or c in r.parents for c in covered)] == []


def test_data_shows_a_handful_of_entries():
    entries = sorted(p.name for p in (REPO / "data").iterdir())
    assert len(entries) <= 8, entries
    assert {"catalog.toml", "h200", "h200-confirm", "archive"} <= set(entries)


# --- names and paths --------------------------------------------------------------------------------------------

def test_a_name_loads_its_set_and_a_path_stays_a_path(monkeypatch):
    by_name = results.load("h200-v6-confirm12")
    assert set(by_name["kernel"]) == {"gqa_decode", "mla_decode", "sparse_mla_decode"}
    assert set(by_name["grid"]) == {"v6confirm2"}  # only the set's sweeps of the shared archive folder
    assert len(results.load("h200")) == len(results.load(REPO / "data" / "h200"))
    assert catalog.is_name("h200") and not catalog.is_name("./h200") and not catalog.is_name(Path("h200"))
    assert catalog.sources("runs/x") == [Path("runs/x")]
    monkeypatch.chdir(REPO / "data")  # a folder called like a set: ./name is the folder, name the set
    assert catalog.sources("./h200") == [Path("./h200")]
    with pytest.raises(SplitlabError, match="'h300' is not in the catalog; expected a path or one of h200, "):
        catalog.get("h300")


def test_a_role_loads_every_set_with_that_role():
    assert catalog.is_name("confirm") and catalog.sources("confirm") == catalog.sources("h200-confirm")
    assert len(results.load("archive")) == sum(len(results.load(e.name)) for e in catalog.entries("archive"))
    info = datasets.data_info("confirm")
    folders = list((catalog.DATA_DIR / "h200-confirm").glob("*/sweep.json"))
    assert info.name == "confirm" and info.path == catalog.DATA_DIR and len(info.sweeps) == len(folders) >= 3
    assert report.notebook_parameters("confirm") == report.notebook_parameters("confirm") | dict(confirm=[])


def test_the_report_reads_names_and_injects_the_catalog_s_sets():
    info = datasets.data_info("h200-v6-confirm12")
    assert info.name == "h200-v6-confirm12" and len(info.sweeps) == 3
    assert datasets.describe(info).startswith("**Data:** `h200-v6-confirm12` ")
    assert report.notebook_parameters()["data"] == "h200"
    assert report.notebook_parameters()["confirm"] == ["h200-confirm"]
    assert report.notebook_parameters(REPO / "data" / "h200")["confirm"] == ["h200-confirm"]  # the same set by path
    assert report.notebook_parameters("h200-v2")["confirm"] == []  # confirm sets belong to the current set
    assert report.notebook_parameters("h200-v2")["data"] == "h200-v2"


def test_catalog_data_is_known_by_name_by_path_and_inside_and_peers_come_from_the_catalog(tmp_path, monkeypatch):
    """Issue 39: the comparison of the kernels with their peers is the catalog's peers set whatever ``--data``
    names, so long as it is catalog data: a set by name, its folder by path (absolute, relative, through a link), a
    sweep folder inside it, a folder of sets, another set of the device; data outside the catalog have none."""
    h200 = REPO / "data" / "h200"
    (tmp_path / "link").symlink_to(h200)
    monkeypatch.chdir(REPO)
    peers = ["h200-peers", "h200-peers-repeat"]
    for data in ("h200", h200, "data/h200", tmp_path / "link", str(h200) + "/"):
        assert [e.name for e in catalog.sets_of(data)] == ["h200"], data
        assert catalog.set_at(data).name == "h200" and [e.name for e in catalog.peers_of(data)] == peers, data
        p = report.notebook_parameters(data)
        assert (p["confirm"], p["peers"]) == (["h200-confirm"], peers), data  # the report's sets, every way
    inside = h200 / "gqa_decode-default"
    assert catalog.set_at(inside) is None and [e.name for e in catalog.sets_of(inside)] == ["h200"]
    assert report.notebook_parameters(inside)["peers"] == peers and report.notebook_parameters(inside)["confirm"] == []
    study = REPO / "data" / "h200-study"
    assert catalog.set_at(study) is None and len(catalog.sets_of(study)) == 3  # a folder of three sets
    assert catalog.set_at(study / "gqa_decode-keytiles").name == "h200-keytiles"
    for data in ("h200-v2", "h200-confirm", "confirm", study):
        assert report.notebook_parameters(data)["peers"] == peers, data
    outside = REPO / "tests" / "fixtures" / "sweeps"
    assert catalog.sets_of(outside) == [] and catalog.peers_of(outside) is None and catalog.set_at(outside) is None
    assert report.notebook_parameters(outside)["peers"] == []


def test_adding_a_confirm_set_is_one_entry(tmp_path, monkeypatch):
    text = (REPO / "data" / "catalog.toml").read_text()
    cur = text[text.index("[sets.h200]"):text.index("# --- archive")]
    (tmp_path / "h200").symlink_to(REPO / "data" / "h200")
    (tmp_path / "h200-confirm").symlink_to(REPO / "data" / "h200-confirm")
    (tmp_path / "h200-peers").symlink_to(REPO / "data" / "h200-peers")
    (tmp_path / "catalog.toml").write_text(cur)
    monkeypatch.setattr(catalog, "CATALOG", tmp_path / "catalog.toml")
    assert report.notebook_parameters()["confirm"] == ["h200-confirm"]
    confirm = cur[cur.index("[sets.h200-confirm]"):cur.index("[sets.h200-peers]")]
    extra = confirm.replace("[sets.h200-confirm]", "[sets.h200-confirm-again]")
    (tmp_path / "catalog.toml").write_text(cur + "\n" + extra)
    assert report.notebook_parameters()["confirm"] == ["h200-confirm", "h200-confirm-again"]
    assert len(results.load("h200-confirm-again")) == len(results.load("h200-confirm"))


GOOD = dict(path='"x"', roles='["archive"]', kernel_version="6", command='"splitlab sweep x"', purpose='"p"')


@pytest.mark.parametrize(("change", "needle"), [
    (dict(roles='["current", "nope"]'), r"\[sets.x\] roles = \['current', 'nope'\] is not allowed; expected a list "
                                        "of current, fit, held-out, confirm, peers, study, archive"),
    (dict(size="3"), r"\[sets.x\] size is not allowed; expected keys among command, device"),
    (dict(command='""'), r"\[sets.x\] command is missing or not a string"),
    (dict(kernel_version='"6"'), r"\[sets.x\] kernel_version is missing or not an integer"),
])
def test_a_malformed_catalog_is_one_error_naming_the_file_and_key(tmp_path, change, needle):
    path = tmp_path / "catalog.toml"
    path.write_text("[sets.x]\n" + "".join(f"{k} = {v}\n" for k, v in (GOOD | change).items()))
    with pytest.raises(SplitlabError, match=re.escape(str(path)) + ": " + needle):
        catalog.read(path)
    path.write_text("[sets.x]\n" + "".join(f"{k} = {v}\n" for k, v in GOOD.items()))
    assert catalog.read(path).sets["x"].path == tmp_path / "x"
    path.write_text("[sets.fit]\n" + "".join(f"{k} = {v}\n" for k, v in GOOD.items()))
    with pytest.raises(SplitlabError, match=r"\[sets.'fit'\] is not allowed; a name has no path separator and is no "
                       "role"):
        catalog.read(path)
    path.write_text("[sets.x\n")
    with pytest.raises(SplitlabError, match="not a readable TOML catalog"):
        catalog.read(path)


def test_a_missing_catalog_is_empty_and_its_names_say_so(tmp_path):
    assert catalog.read(tmp_path / "none.toml") == catalog.Catalog({}, {})


# --- one definition of each data path ---------------------------------------------------------------------------

def test_no_data_folder_is_hard_coded_outside_the_catalog():
    """String literals (code and docstrings) of splitlab's top-level modules and of the notebooks name sets by their
    catalog name, never by a folder under data/ (comments may cite evidence)."""
    files = [p for p in (REPO / "splitlab").glob("*.py") if p.name != "catalog.py"] + sorted(
        (REPO / "notebooks").glob("*.py"))
    found = []
    for f in files:
        for tok in tokenize.generate_tokens(io.StringIO(f.read_text()).readline):
            if tok.type == tokenize.STRING and re.search(r"\bdata/(?!catalog\.toml)[\w.-]", tok.string):
                found.append(f"{f.name}:{tok.start[0]}")
    assert found == []
