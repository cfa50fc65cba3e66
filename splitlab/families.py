"""splitlab's kernel families: one record per family, every fact about it that code elsewhere looks up.

A family is one of splitlab's own decode kernels (the ``kernel`` column of its sweeps, its card's name) and the
kind of workload it runs (``gqa``, ``mla``, ``sparse_mla``; one family per kind: the planner's constants, the fit
and the held-out split are per kind). The record holds what used to be written by hand in a table per module:

* the kind (``workloads.KINDS`` and ``KERNEL_KINDS`` are views of these records; the fit and its scores group a
  result set's rows by it),
* the label the headline, its figure and the notebooks give the family (``headline.FAMILIES`` is a view),
* the launcher, its fp64 reference and its launch facts as ``"package.module:attribute"`` import paths (what the
  card's ``[impl]`` names too; the sweep harness's benchmark and ``analysis.replay`` import them where they are
  called), and the work-list launcher where the family has one,
* its kernel card (``kernels/<card>.toml``),
* the knobs a launch takes (its ``LaunchFacts`` fields: ``bench.decode.default_knobs``), and the tiles of a
  ``Plan`` its launcher takes beside ``num_splits`` (``analysis.resolve_knobs``),
* the page size its paged cache defaults to (``workloads.get``, a card's shapes),
* its split range: the card's ``num_splits`` range, what the sweeps time and the fitted rule searches
  (``planners.fitted.MAX_SPLITS`` is a view), and the most splits its launcher takes (the grid dimension's limit:
  ``planners.registry.KERNEL_MAX_SPLITS`` is a view, which refuses a plugin's plan past it),
* the peers the kernel comparison sets beside it (``peer_table``; the headline's kernel cells).

No torch, no import above ``errors``: the module sits in the bottom layer (``tests/test_layers.py``), so that the
vocabulary (``workloads``) can be built from it. ``tests/test_families.py`` holds every record to the files a family
needs (its kernel, reference, card, cost-model terms, tests); ``docs/extending.md`` says how to add one.

    from splitlab import families
    families.get("mla_decode").reference       # 'splitlab.kernels.reference:mla_decode'
    families.by_kind("gqa").name               # 'gqa_decode'
    families.names()                           # ['gqa_decode', 'mla_decode', 'sparse_mla_decode']
"""

from __future__ import annotations

from dataclasses import dataclass

from splitlab.errors import SplitlabError

#: How the kernel comparison picks a peer's row per shape: ``best`` its fastest measured point, ``own`` the split
#: FlashInfer's own plan runs (``peers_flashinfer.tc_decode_plan``), ``only`` the card's one point a shape.
PICKS = ("best", "own", "only")


@dataclass(frozen=True)
class Peer:
    """A library kernel the comparison (``peer_table``) sets beside a family's: ``role`` its name in the tables,
    ``card`` its kernel card (``kernels/<card>.toml``, the ``kernel`` column of its sweeps), ``pick`` how its row
    of a shape is chosen (``PICKS``)."""

    role: str
    card: str
    pick: str


@dataclass(frozen=True)
class Family:
    """One of splitlab's kernel families (see the module docstring). Import paths are ``"module:attribute"``
    strings, resolved where they are called (``splitlab.bench.impls.resolve``)."""

    name: str  # the ``kernel`` column of its sweeps; its card's ``name``
    kind: str  # the workload kind it runs (``DecodeWorkload.kind``)
    label: str  # the headline's name for it
    launcher: str  # the Triton launcher (``num_splits=None`` asks the ``splitlab`` planner)
    reference: str  # its fp64 reference
    launch_facts: str  # the grid and knobs a launch resolves to, without launching (``LaunchFacts``)
    card: str  # its kernel card: ``kernels/<card>.toml``
    knobs: tuple[str, ...]  # the knobs a launch takes (``LaunchFacts`` fields; the card's ``[knobs]``)
    plan_tiles: tuple[str, ...]  # the ``Plan`` tiles its launcher takes beside ``num_splits``
    page_size: int  # the page size of its cache by default (1: no pages)
    max_splits: int  # its card's ``num_splits`` range ends here (what the sweeps time, the fit searches)
    peers: tuple[Peer, ...] = ()  # the library kernels the comparison sets beside it
    worklist: str | None = None  # the launcher that runs a schedule's work items (``kernels.worklist``'s tiles), if any
    kernel_max_splits: int = 65535  # the most splits its launcher takes (CUDA's limit on the grid's split axis)

    @property
    def module(self) -> str:
        """The launcher's module (``splitlab.kernels.gqa``)."""
        return self.launcher.partition(":")[0]

    @property
    def test_file(self) -> str:
        """Its kernel tests, relative to the repository: ``tests/test_kernels_<kind>.py``."""
        return f"tests/test_kernels_{self.kind}.py"


ALL: tuple[Family, ...] = (
    Family(
        name="gqa_decode", kind="gqa", label="GQA",
        launcher="splitlab.kernels.gqa:gqa_decode",
        reference="splitlab.kernels.reference:gqa_decode",
        launch_facts="splitlab.kernels.gqa:gqa_launch_facts",
        card="gqa_decode",
        knobs=("num_splits", "block_n", "num_warps", "num_stages"),
        plan_tiles=("block_n",),  # block_h is the padded group, not a knob
        page_size=16,
        max_splits=128,
        peers=(Peer("FlashInfer (own plan)", "flashinfer_decode", "own"),
               Peer("FlashInfer (best split)", "flashinfer_decode", "best"),
               Peer("SDPA cuDNN", "sdpa_cudnn", "only"),
               Peer("SDPA flash", "sdpa_flash", "only")),
        worklist="splitlab.kernels.worklist:gqa_decode_scheduled",
    ),
    Family(
        name="mla_decode", kind="mla", label="MLA",
        launcher="splitlab.kernels.mla:mla_decode",
        reference="splitlab.kernels.reference:mla_decode",
        launch_facts="splitlab.kernels.mla:mla_launch_facts",
        card="mla_decode",
        knobs=("num_splits", "block_n", "block_h", "num_warps", "num_stages"),
        plan_tiles=("block_n", "block_h"),
        page_size=64,
        max_splits=256,
        peers=(Peer("FlashMLA", "flashmla_decode", "only"),
               Peer("FlashInfer MLA fa3", "flashinfer_mla", "only"),
               Peer("FlashInfer MLA fa2", "flashinfer_mla_fa2", "only")),
        worklist="splitlab.kernels.worklist:mla_decode_scheduled",
    ),
    Family(
        name="sparse_mla_decode", kind="sparse_mla", label="sparse MLA",
        launcher="splitlab.kernels.sparse_mla:sparse_mla_decode",
        reference="splitlab.kernels.reference:sparse_mla_decode",
        launch_facts="splitlab.kernels.sparse_mla:sparse_mla_launch_facts",
        card="sparse_mla_decode",
        knobs=("num_splits", "block_k", "block_h", "num_warps"),
        plan_tiles=("block_k", "block_h"),
        page_size=1,
        max_splits=64,
        worklist="splitlab.kernels.sparse_mla:sparse_mla_decode_scheduled",
    ),
)


def check(records: tuple[Family, ...]) -> None:
    """Refuse a table of records that cannot be looked up: a name or kind twice, an import path not
    ``module:attribute``, a peer picked in a way ``peer_table`` does not know."""
    for field_ in ("name", "kind"):
        seen = [getattr(f, field_) for f in records]
        twice = sorted({v for v in seen if seen.count(v) > 1})
        if twice:
            raise SplitlabError(f"families: {field_} {', '.join(map(repr, twice))} given twice; one family per "
                                f"{field_}")
    for f in records:
        for key in ("launcher", "reference", "launch_facts", "worklist"):
            path = getattr(f, key)
            if path is not None and (path.count(":") != 1 or not all(path.split(":"))):
                raise SplitlabError(f"families: {f.name}.{key}={path!r} is not allowed; expected "
                                    "'package.module:attribute'")
        for p in f.peers:
            if p.pick not in PICKS:
                raise SplitlabError(f"families: {f.name} peer {p.role!r}: pick={p.pick!r} is not allowed; expected "
                                    f"one of {', '.join(PICKS)}")


check(ALL)
_BY_NAME = {f.name: f for f in ALL}
_BY_KIND = {f.kind: f for f in ALL}


def names() -> list[str]:
    """The families' names (the ``kernel`` column of their sweeps), in table order."""
    return list(_BY_NAME)


def kinds() -> tuple[str, ...]:
    """The workload kinds the families run, in table order."""
    return tuple(_BY_KIND)


def get(name: str) -> Family:
    """The family of kernel ``name`` (``gqa_decode``)."""
    if name not in _BY_NAME:
        raise SplitlabError(f"family={name!r} is not allowed; expected one of {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def by_kind(kind: str) -> Family:
    """The family that runs workloads of ``kind`` (``gqa``)."""
    if kind not in _BY_KIND:
        raise SplitlabError(f"kind={kind!r} is not allowed; expected one of {', '.join(_BY_KIND)}")
    return _BY_KIND[kind]
