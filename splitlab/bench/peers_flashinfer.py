"""FlashInfer's decode kernels as sweep implementations (kernel cards of type "external"), on splitlab's own
paged inputs.

* ``FLASHINFER_DECODE``: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend="fa2")`` over
  splitlab's ``k_cache`` / ``v_cache`` ``[num_pages, page_size, Hkv, D]`` (FlashInfer's NHD layout) and its
  block table, turned into FlashInfer's ``indptr`` / ``indices`` / ``last_page_len``. One knob, ``num_splits``:
  the KV chunks of the longest request, set through ``plan(fixed_split_size=cdiv(pages, num_splits))``
  (``disable_split_kv=True`` at 1). The point whose chunk count equals FlashInfer's own plan runs FlashInfer's
  own plan (no split argument); every plan is read back (``padded_batch_size``) and must hold the work tiles
  the row's ``num_splits`` says, else the point is an error.
* ``FLASHINFER_MLA_FA3`` / ``FLASHINFER_MLA_FA2``: ``BatchMLAPagedAttentionWrapper`` (backend ``fa3``, Hopper;
  ``fa2``) on splitlab's latent cache ``[num_pages, 64, 576]`` in its packed layout (512 ckv + 64 kpe in one
  row, as splitlab stores it); no knob (the backends schedule their own splits).

FlashInfer is imported only when a point runs (``pip install 'splitlab[peers]'``; it JIT-compiles its CUDA
modules with nvcc on first use). Without it, or without a GPU, ``unavailable()`` gives the one-line reason
and the sweep stores the points ``skipped``. Checked against ``splitlab.kernels.reference`` like every
implementation. Tested with flashinfer-python 0.7.2.post1 on an H200.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

from splitlab.bench.peers import gpu_missing, library_missing
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError, bad
from splitlab.intmath import cdiv
from splitlab.workloads import DecodeWorkload

LIBRARY = "flashinfer"
INSTALL_HINT = "pip install 'splitlab[peers]' (flashinfer-python)"
#: Float workspace shared by the wrappers (FlashInfer keeps split partials there; 128 MB is its recommendation,
#: fixed splits of long batches need more).
WORKSPACE_BYTES = 1 << 30
#: ``PrefillPlan`` (scheduler.cuh): CTAs per SM it budgets for the split-KV grid.
PLAN_BLOCKS_PER_SM = 2
#: ``PrefillSplitQOKVIndptr``: the smallest KV chunk its search tries, in keys (``max(128 // page_size, 1)`` pages).
MIN_CHUNK_KEYS = 128
#: The MLA backends' latent layout: ckv (the values) + kpe (rope) columns.
MLA_CKV, MLA_KPE = 512, 64
MLA_BACKENDS = ("fa3", "fa2")

_SRC = ("flashinfer-python 0.7.2.post1 include/flashinfer/attention/scheduler.cuh (PrefillPlan, "
        "PrefillSplitQOKVIndptr, PrefillBinarySearchKVChunkSize) and include/flashinfer/utils.cuh "
        "(FA2DetermineCtaTileQ)")


# --- FlashInfer's own plan for the tensor-core decode (host code, ported) ---------------------------------

class TcDecodePlan(NamedTuple):
    """The split FlashInfer's tensor-core decode runs: ``num_splits`` KV chunks for the longest request
    (``per_request`` for each), ``chunk_pages`` pages a chunk, ``cta_tile_q`` packed query rows a CTA,
    ``work_tiles`` (request, query tile, chunk) triples (FlashInfer's ``padded_batch_size``: the grid's x
    extent; y is the kv heads), ``split_kv`` whether partials are merged."""

    num_splits: int
    per_request: tuple[int, ...]
    chunk_pages: int
    cta_tile_q: int
    work_tiles: int
    split_kv: bool


def cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """``FA2DetermineCtaTileQ`` for a head dim under 256 on sm_80+: 128 rows past 64 packed query rows, 64
    past 16, else 16 (the 1x4 warp layout; its shared-memory probe passes for every head dim under 256 at
    2-byte KV on the H100/H200's 227 KB). Source: ``_SRC``."""
    if head_dim >= 256:
        raise bad("head_dim", head_dim, "under 256 (the ported branch of FA2DetermineCtaTileQ)")
    if packed_qo_len > 64:
        return 128
    return 64 if packed_qo_len > 16 else 16


def tc_decode_plan(w: DecodeWorkload, sm_count: int, num_splits: int | None = None) -> TcDecodePlan:
    """What ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True).plan`` runs for ``w`` (one query token
    per request, no CUDA graph mode), by the rule of FlashInfer's ``PrefillPlan`` (``_SRC``).

    Packed query rows per request = the group; ``cta_tile_q`` as ``cta_tile_q``; query tiles per request
    ``cdiv(group, cta_tile_q)``. ``num_splits=None`` (FlashInfer's own plan): ``max_batch_size_if_split =
    2 * sm_count // num_kv_heads``; binary search over the chunk size (pages) from ``max(128 // page_size, 1)``
    to the longest request's pages for the smallest chunk whose total work tiles fit; ``split_kv`` iff that chunk
    is shorter than the longest request. ``num_splits = s``: ``fixed_split_size = cdiv(max_pages, s)`` pages
    (``disable_split_kv`` at ``s = 1``), ``split_kv`` iff some request gets more than one chunk."""
    pages = [max(cdiv(n, w.page_size), 1) for n in w.lengths]  # a request without keys still gets a tile
    max_pages = max(pages)
    ctq = cta_tile_q(w.group, w.head_dim_qk)
    q_tiles = cdiv(w.group, ctq)
    if num_splits is None:
        budget = PLAN_BLOCKS_PER_SM * sm_count // w.num_kv_heads
        lo, hi = max(MIN_CHUNK_KEYS // w.page_size, 1), max_pages
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(q_tiles * cdiv(p, mid) for p in pages) > budget:
                lo = mid + 1
            else:
                hi = mid
        chunk, split_kv = lo, lo < max_pages
        per = tuple(cdiv(p, chunk) for p in pages)
    elif num_splits == 1:
        chunk, split_kv, per = max_pages, False, (1,) * len(pages)
    else:
        chunk = cdiv(max_pages, num_splits)
        per = tuple(cdiv(p, chunk) for p in pages)
        split_kv = max(per) > 1
    return TcDecodePlan(max(per), per, chunk, ctq, q_tiles * sum(per), split_kv)


def split_arguments(w: DecodeWorkload, num_splits: int) -> dict:
    """``plan()`` keywords that pin ``num_splits`` chunks on the longest request."""
    if num_splits == 1:
        return {"disable_split_kv": True}
    return {"fixed_split_size": cdiv(max(max(cdiv(n, w.page_size), 1) for n in w.lengths), num_splits)}


# --- shared plumbing ---------------------------------------------------------------------------------------

_WORKSPACE: dict = {}


def _workspace():
    """The float workspace, allocated once (zeroed: FlashInfer asks for zeros on first use)."""
    import torch

    if "buf" not in _WORKSPACE:
        _WORKSPACE["buf"] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    return _WORKSPACE["buf"]


def _flashinfer():
    import flashinfer

    return flashinfer


def _check_workload(w: DecodeWorkload, label: str) -> None:
    """16-bit caches and no empty request (FlashInfer's page CSR gives every request at least one page)."""
    if w.dtype not in ("bf16", "fp16"):
        raise bad("dtype", w.dtype, f"bf16 or fp16 ({label} is timed on 16-bit caches here)")
    if min(w.lengths) < 1:
        raise bad("seq_lens", w.seq_lens, f"lengths >= 1 ({label})")


def csr_pages(block_table, seq_lens, page_size: int):
    """FlashInfer's page CSR from splitlab's block table: ``(indptr [B+1], indices, last_page_len [B])`` int32 on
    the table's device (requests of at least one key: ``launch_facts`` refuses empty ones)."""
    import torch

    lens = [int(n) for n in seq_lens.tolist()]
    pages = [cdiv(n, page_size) for n in lens]
    table = block_table.cpu()
    indices = torch.cat([table[b, :p] for b, p in enumerate(pages)])
    indptr = torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, pages, strict=True)], dtype=torch.int32)
    dev = block_table.device
    return indptr.to(dev), indices.to(torch.int32).to(dev), last.to(dev)


class _PeerBase:
    """What the FlashInfer implementations share: the availability check, splitlab's paged inputs and fp64
    reference, and a cache of planned wrappers for the shape in hand (plans are host work, made once per
    (shape, knobs); every input set of the shape has the same lengths, so one plan serves them all)."""

    knobs: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    label = "flashinfer"

    def __init__(self) -> None:
        self._plans: dict = {}
        self._shape: DecodeWorkload | None = None

    def unavailable(self) -> str | None:
        return library_missing(LIBRARY, f"{self.label}: FlashInfer", INSTALL_HINT) or gpu_missing(self.label)

    def inputs(self, w: DecodeWorkload, *, device, seed: int) -> dict:
        from splitlab.kernels.inputs import workload_inputs

        if w.kind not in self.kinds:
            raise bad("kind", w.kind, " or ".join(self.kinds) + f" ({self.label})")
        return workload_inputs(w, device=device, seed=seed, draw_on="device")

    def _planned(self, w: DecodeWorkload, key: tuple, make: Callable[[], object]) -> object:
        if self._shape != w:  # a new shape: drop the old shape's wrappers (and the buffers they hold)
            self._plans, self._shape = {}, w
        if key not in self._plans:
            self._plans[key] = make()
        return self._plans[key]


# --- paged GQA decode ---------------------------------------------------------------------------------------

class FlashInferDecode(_PeerBase):
    """FlashInfer's tensor-core paged decode (see the module docstring); knob ``num_splits``."""

    knobs = ("num_splits",)
    kinds = ("gqa",)
    label = "flashinfer-decode"

    def launch_facts(self, w: DecodeWorkload, knobs: dict, device: DeviceSpec) -> dict:
        from splitlab.bench.impls import FACT_COLUMNS

        extra = set(knobs) - set(self.knobs)
        if extra:
            raise bad("knobs", sorted(extra), f"only num_splits ({self.label})")
        if w.kind != "gqa":
            raise bad("kind", w.kind, f"gqa ({self.label})")
        _check_workload(w, self.label)
        s = knobs.get("num_splits")
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise bad("num_splits", s, "an integer >= 1")
        plan = tc_decode_plan(w, device.sm_count, s)
        facts = dict.fromkeys(FACT_COLUMNS)
        facts.update(num_splits=plan.num_splits, ctas=plan.work_tiles * w.num_kv_heads)
        return facts

    def reference(self, w: DecodeWorkload, inputs: dict):
        from splitlab.kernels import reference

        return reference.gqa_decode(inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["block_table"],
                                    inputs["seq_lens"])

    def _wrapper(self, w: DecodeWorkload, inputs: dict, num_splits: int | None):
        import torch

        fi = _flashinfer()
        sm_count = torch.cuda.get_device_properties(inputs["q"].device).multi_processor_count
        own = tc_decode_plan(w, sm_count)
        want = own if num_splits is None else tc_decode_plan(w, sm_count, num_splits)
        # FlashInfer's own plan where it runs this chunk count; the pinned split elsewhere.
        kwargs = {} if want.num_splits == own.num_splits else split_arguments(w, num_splits)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(), "NHD", use_tensor_cores=True, backend="fa2")
        plan_decode(wrapper, w, inputs, **kwargs)
        tiles = _planned_tiles(wrapper)
        if tiles != want.work_tiles:
            how = "its own plan" if not kwargs else f"plan({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
            raise RuntimeError(f"FlashInfer's {how} made {tiles} work tiles; num_splits={want.num_splits} means "
                               f"{want.work_tiles} (the row could not say which split ran)")
        return wrapper

    def call(self, w: DecodeWorkload, inputs: dict, knobs: dict) -> Callable:
        import torch

        s = knobs.get("num_splits")
        wrapper = self._planned(w, ("decode", s), lambda: self._wrapper(w, inputs, s))
        q, kv = inputs["q"], (inputs["k_cache"], inputs["v_cache"])
        out = torch.full_like(q, math.nan)  # a row the kernel leaves unwritten fails the check

        def run():
            wrapper.run(q, kv, out=out)
            return out

        return run


def plan_decode(wrapper, w: DecodeWorkload, inputs: dict, **kwargs) -> None:
    """``wrapper.plan`` (a ``BatchDecodeWithPagedKVCacheWrapper``) for ``w`` on splitlab's paged ``inputs`` (their
    block table and ``seq_lens`` as FlashInfer's page CSR, ``csr_pages``); ``kwargs``: more ``plan()`` keywords."""
    indptr, indices, last = csr_pages(inputs["block_table"], inputs["seq_lens"], w.page_size)
    wrapper.plan(indptr, indices, last, w.num_q_heads, w.num_kv_heads, w.head_dim_qk, w.page_size,
                 pos_encoding_mode="NONE", q_data_type=inputs["q"].dtype, kv_data_type=inputs["k_cache"].dtype,
                 **kwargs)


def graph_decode_wrapper(batch: int, max_pages: int, device):
    """A tensor-core decode wrapper for CUDA graphs (``use_cuda_graph=True``): its page CSR buffers allocated here
    for ``batch`` requests and ``max_pages`` pages in all, so that every later ``plan_decode`` writes the addresses a
    captured ``run()`` holds (FlashInfer's graph mode: the batch fixed for the wrapper's life)."""
    import torch

    def buf(n: int):
        return torch.zeros(n, dtype=torch.int32, device=device)

    return _flashinfer().BatchDecodeWithPagedKVCacheWrapper(
        _workspace(), "NHD", use_cuda_graph=True, use_tensor_cores=True, backend="fa2",
        paged_kv_indptr_buffer=buf(batch + 1), paged_kv_indices_buffer=buf(max_pages),
        paged_kv_last_page_len_buffer=buf(batch))


def _planned_tiles(wrapper) -> int:
    """``padded_batch_size`` of a tensor-core decode plan (``PrefillPlanInfo``'s first field)."""
    info = getattr(wrapper, "_plan_info", None)
    try:
        return int(info[0])
    except (TypeError, IndexError, ValueError):
        raise RuntimeError(f"cannot read FlashInfer's plan ({type(info).__name__}); the row could not say which "
                           "split ran") from None


# --- MLA decode ----------------------------------------------------------------------------------------------

class FlashInferMLA(_PeerBase):
    """FlashInfer's batch MLA decode on one backend (``fa3`` or ``fa2``); no knobs."""

    kinds = ("mla",)

    def __init__(self, backend: str) -> None:
        super().__init__()
        if backend not in MLA_BACKENDS:
            raise bad("backend", backend, " or ".join(MLA_BACKENDS))
        self.backend = backend
        self.label = f"flashinfer-mla-{backend}"

    def launch_facts(self, w: DecodeWorkload, knobs: dict, device: DeviceSpec) -> None:
        if knobs:
            raise bad("knobs", sorted(knobs), f"none ({self.label} schedules its own splits)")
        if w.kind != "mla":
            raise bad("kind", w.kind, f"mla ({self.label})")
        if (w.head_dim_v, w.head_dim_qk - w.head_dim_v) != (MLA_CKV, MLA_KPE):
            raise SplitlabError(f"head_dim_qk={w.head_dim_qk}, head_dim_v={w.head_dim_v} is not allowed; expected "
                                f"{MLA_CKV + MLA_KPE}/{MLA_CKV} ({self.label}: {MLA_CKV} ckv + {MLA_KPE} kpe)")
        _check_workload(w, self.label)
        return None

    def reference(self, w: DecodeWorkload, inputs: dict):
        from splitlab.kernels import reference

        return reference.mla_decode(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"],
                                    head_dim_v=w.head_dim_v)

    def _wrapper(self, w: DecodeWorkload, inputs: dict):
        wrapper = _flashinfer().BatchMLAPagedAttentionWrapper(_workspace(), backend=self.backend)
        plan_mla(wrapper, w, inputs)
        return wrapper

    def call(self, w: DecodeWorkload, inputs: dict, knobs: dict) -> Callable:
        import torch

        wrapper = self._planned(w, ("mla",), lambda: self._wrapper(w, inputs))
        q, kv = inputs["q"], inputs["kv_cache"]
        out = torch.full((w.batch, w.num_q_heads, w.head_dim_v), math.nan, dtype=q.dtype, device=q.device)

        def run():
            wrapper.run(query=q, kv_cache=kv, out=out)
            return out

        return run


def plan_mla(wrapper, w: DecodeWorkload, inputs: dict) -> None:
    """``wrapper.plan`` (a ``BatchMLAPagedAttentionWrapper``) for ``w`` on splitlab's latent cache ``inputs`` (one
    query token a request; the page CSR by ``csr_pages``; packed query and cache layouts)."""
    import torch
    from flashinfer.mla import MLAPlanMetadata

    indptr, indices, _ = csr_pages(inputs["block_table"], inputs["seq_lens"], w.page_size)
    dev = inputs["q"].device
    meta = MLAPlanMetadata.csr(torch.arange(w.batch + 1, dtype=torch.int32, device=dev), indptr, indices,
                               inputs["seq_lens"].to(torch.int32))
    wrapper.plan(metadata=meta, num_heads=w.num_q_heads, head_dim_ckv=MLA_CKV, head_dim_kpe=MLA_KPE,
                 page_size=w.page_size, causal=False, sm_scale=1.0 / math.sqrt(w.head_dim_qk),
                 q_data_type=inputs["q"].dtype, kv_data_type=inputs["kv_cache"].dtype,
                 query_layout="packed", kv_cache_layout="packed")


def graph_mla_wrapper(batch: int, max_pages: int, backend: str, device):
    """A batch MLA wrapper (``backend``: ``MLA_BACKENDS``) for CUDA graphs: its CSR buffers allocated here for
    ``batch`` requests and ``max_pages`` pages in all (what ``use_cuda_graph=True`` asks; see
    ``graph_decode_wrapper``)."""
    import torch

    if backend not in MLA_BACKENDS:
        raise bad("backend", backend, " or ".join(MLA_BACKENDS))

    def buf(n: int):
        return torch.zeros(n, dtype=torch.int32, device=device)

    return _flashinfer().BatchMLAPagedAttentionWrapper(
        _workspace(), use_cuda_graph=True, qo_indptr=buf(batch + 1), kv_indptr=buf(batch + 1),
        kv_indices=buf(max_pages), kv_len_arr=buf(batch), backend=backend)


FLASHINFER_DECODE = FlashInferDecode()
FLASHINFER_MLA_FA3 = FlashInferMLA("fa3")
FLASHINFER_MLA_FA2 = FlashInferMLA("fa2")
