"""Plan once, run every layer: the work-list decode kernels (``kernels.worklist``) behind a plan/run pair shaped like
FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.plan()`` / ``run()``.

A server decodes a batch once per layer with the same lengths, often inside a CUDA graph. ``plan(seq_lens)`` does
everything that depends on the lengths, once per batch: it validates them, asks a scheduler
(``planners.schedulers``) for the batch's work items and writes the work list into device buffers allocated once, at
the first plan, with a fixed capacity. ``run(...)``, once per layer, only launches: the partial kernel and the merge,
with no host sync, no Python planning and no re-validation (a few shape / dtype / device comparisons of host-visible
metadata, or none with ``check=False``), through ``kernels.bound_launch`` (Triton's argument binding once per
specialization, not once per call).

    p = GQADecodePlan(32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", max_batch=64)
    p.plan(seq_lens)                       # host lengths (list of ints); once per batch
    for layer in layers:
        out = p.run(q, k_cache[layer], v_cache[layer], block_table)

The three families share that contract: ``GQADecodePlan`` (paged GQA/MHA/MQA), ``MLADecodePlan`` (absorbed MLA over
a paged latent cache) and ``SparseMLADecodePlan`` (sparse top-k MLA over a token pool: a request is a query token,
``plan(topk_lens)`` takes the positions of its index row it walks, ``run(q, kv_cache, indices)`` gathers them;
``device_schedule`` without ``splitlab``). Each is ``_DecodePlan``'s machinery (capacity, buffers, ``plan()``, the
merge, timelines) around its family's work-list kernel.

Capacity. The device buffers (the work list: ``items``, ``cta_offsets``, ``partial_offsets`` and the slot count,
packed in one int32 tensor; the fp32 partial rows and lse; an lse scratch row per request) are allocated at the first
``plan()`` (or never again): ``max_batch`` requests (default: the first plan's batch), ``max_ctas`` CTA slots,
``max_items`` items and ``max_partial_rows`` partial rows (defaults: ``capacity_bound``, the most the scheduler can
deal ``max_batch`` requests; for ``splitlab`` a budget, ``BUDGET_WAVES`` waves of slots or ``BUDGET_SPLITS`` a
request, that its scheduler keeps within: ``schedulers.splitlab(max_ctas=...)``). A later ``plan()`` copies into the
same tensors, so the addresses a captured graph holds stay valid; a batch or schedule past a capacity is refused in
one line.

CUDA graphs (``use_cuda_graph=True``). The launches must not depend on the lengths after capture: the partial
kernel's grid is the capacity (``max_ctas`` slots x head groups) and it reads the plan's slot count from the device
(``worklist``'s ``BOUNDED`` kernels: a program past the count exits at once); the merge is launched whatever the plan
(a request without partial rows exits at once); the kernels' constexprs (tile, ``PERSISTENT`` by the scheduler) are
fixed when the plan is made. A captured graph is for one batch size: re-``plan()`` with the batch it was captured
with before a replay (the merge's grid and ``partial_offsets`` are per request). The merge's ``BLOCK_S`` stays the
one of the plan at capture, which is correct for any later plan (the merge walks any count of rows in chunks).
The empty programs of a capacity grid cost GPU time (a GPU question: keep ``max_ctas`` near the waves the batch
needs). Without ``use_cuda_graph`` the grid is the plan's exact slot count and the merge runs only where a request
was split; ``run()`` then refuses to be captured (a later plan would change the grid).

Schedules on the device (``device_schedule=True``, with ``use_cuda_graph=True``; schedulers ``balanced``,
``stream_k``, ``uniform`` at a ``num_splits``, ``flashmla`` (MLA; persistent) and ``splitlab`` (GQA and MLA)).
``plan_on_device(seq_lens)`` takes
the lengths as a device int32 tensor and launches ``kernels.device_schedule``'s kernels into the same buffers (the host
scheduler's work list, bit for bit; ``splitlab``'s is the one ``schedulers.splitlab`` makes within the plan's
``max_ctas`` / ``max_items``: its candidates priced on the device in fp64, one program each, the same winner), with
no host sync: a graph captures it with ``run()``, and each replay recomputes the schedule from the lengths the tensor
then holds, so one graph a batch size serves every length (padded requests: length 0). ``splitlab``'s terms that do
not depend on the lengths (the fitted constants, the candidates' split counts and budgets) are made on the host once
per batch size, at its first ``plan_on_device`` (outside a capture). The host never sees that schedule
(``schedule`` is None, ``run()`` cannot check the lengths against the block table: a request past it is NaN); past a
capacity smaller than ``capacity_bound`` every row is NaN and ``status`` (a device int32) is 1. ``plan()`` still works
on such a plan.

Programmatic dependent launch (``pdl=True``, GQA and MLA). The merge is launched with programmatic dependent
launch after the tl tile, which lets it launch at each program's start (``worklist``'s ``LAUNCH_DEPENDENTS=1``): its
launch and prologue overlap the partial kernel's tail, its programs wait for the partial kernel's end before they
read a partial row (``workitems._merge_kernel``'s ``WAIT_PRIOR``), and program (0, 0) always waits, so the merge
never ends before the partial kernel. Nothing changes after a Gluon tile or under Triton's interpreter. On the
H200 this trigger ran the work-list launch 1.04-1.05x faster at 1-4K keys (``experiments/short_launch``); what it
does to an eager ``run()`` is ``experiments/plan_run``'s question.

Host to device. ``plan()`` writes the work list in one copy: from a pinned staging buffer without a stream sync on
a GPU (two staging buffers in turn, each reused only after its previous copy's event has completed, so a plan made
while the GPU still runs the last step does not stall the host), a plain copy on the CPU. ``plan()`` and ``run()``
are stream-ordered: make both on the stream that runs the kernels (a later ``plan()`` then never overwrites a work
list that an earlier ``run()`` still reads).

The default launchers. ``gqa_decode`` / ``mla_decode`` with ``num_splits=None`` keep their path (the split-count
kernel at the ``splitlab`` planner's split count, planned in Python after one host read of ``seq_lens``): making
them a thin use of a plan would change which kernel runs (the work-list kernel, its tile and grid order) and which
split is chosen (the scheduler's schedule, not the split-count rule's), which wants an H200 timing first. The results
agree (``tests/test_decode_plan.py``: a plan of scheduler ``uniform`` at a split count against ``gqa_decode`` at that
count, within fp32 rounding).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import cdiv, next_power_of_two
from splitlab.kernels import _launch
from splitlab.kernels import device_schedule as _ds
from splitlab.kernels import mla_sm90_ws as ws
from splitlab.kernels import mqa_sm90_ws as mqa_ws
from splitlab.kernels import workitems as _wi
from splitlab.kernels import worklist as _wl
from splitlab.kernels._launch import (
    FLOAT_DTYPES,
    FP8_KV_DTYPE,
    LOG2E,
    TORCH_DTYPE_NAMES,
    check_knob,
    check_out,
    check_pow2,
    check_spans,
)
from splitlab.kernels.bound_launch import BoundLaunch
from splitlab.kernels.combine import combine_tile
from splitlab.kernels.timeline import Timelines
from splitlab.planners import schedulers as S
from splitlab.planners.schedule import Schedule
from splitlab.workloads import DecodeWorkload

__all__ = ["GQADecodePlan", "MLADecodePlan", "SparseMLADecodePlan", "Capacity", "PERSISTENT_SCHEDULERS",
           "device_merge_rows"]

#: Schedulers whose schedules may run several items a slot (the persistent kernel variant, fixed when a plan is made).
PERSISTENT_SCHEDULERS = ("stream_k", "flashmla")
#: Off: run() launches through Triton's own path every call (A/B runs: experiments/plan_run/launch_probe.py);
#: on, through ``kernels.bound_launch`` (Triton's binding once per specialization).
BOUND_LAUNCH = True
#: The merge tile of a plan made on the device (which never sees a request's row count): rows a chunk, the rows a
#: request has where one wave of a head group's CTA slots is dealt over the batch (``cdiv(slots, batch)``, to a power
#: of two), held to ``[DEVICE_MERGE_ROWS_MIN, DEVICE_MERGE_ROWS_MAX]`` (``device_merge_rows``). With a request's worst
#: case (64 rows a chunk) MLA-128's device plan ran 42 us a layer slower than the host plan of the same work list
#: (H200, 16 requests of 8K keys). Timed at 4, 8, 16 and 32 rows (experiments/plan_run/gpu.py; two H100 runs and one
#: H200 run), the 32-layer step over the host plan's: MLA-128 (66 slots a group, 16 requests: 8 rows) 1.016-1.028 at
#: 4-8, 1.148-1.164 at 32; MLA-16 (264 slots, 16 requests: 32 rows) 1.011-1.022 at 32, 1.019-1.031 at 8; GQA 32/8 (49
#: slots, 8 and 64 requests: 8 rows) within 1.013 at 8, up to 1.032 at 16.
DEVICE_MERGE_ROWS_MIN, DEVICE_MERGE_ROWS_MAX = 8, 32
#: An int: every device plan's merge tile at that many rows a chunk (A/B runs); None: ``device_merge_rows``'s rule.
DEVICE_MERGE_ROWS: int | None = None


def device_merge_rows(batch: int, slots_per_group: int) -> int:
    """Rows a chunk of a device plan's merge tile for ``batch`` requests on ``slots_per_group`` CTA slots a head group
    (``DEVICE_MERGE_ROWS`` where set)."""
    if DEVICE_MERGE_ROWS is not None:
        return DEVICE_MERGE_ROWS
    want = next_power_of_two(cdiv(slots_per_group, batch))
    return min(DEVICE_MERGE_ROWS_MAX, max(DEVICE_MERGE_ROWS_MIN, want))


#: The ``splitlab`` scheduler's default budget: ``max(BUDGET_SPLITS x max_batch, BUDGET_WAVES x a head group's
#: slots)`` CTA slots. Its candidates past it are left out; modelled on the H200 over 56 batches a shape (1-256
#: requests, 1K-128K keys, ragged and not; GQA 32/8, 64/8, 16/2, MQA-128, MLA-16, MLA-128), that costs at most 1.2%
#: of the modelled time, 0.03% in geomean (experiments/plan_run).
BUDGET_WAVES, BUDGET_SPLITS = 8, 8
#: Alignment (in int32s, 128 bytes) of each segment of the packed work list, so that every pointer a kernel takes
#: is as aligned as a fresh tensor's (Triton specialises on 16-byte divisibility).
_ALIGN = 32


@dataclass(frozen=True)
class Capacity:
    """What a plan's buffers hold: requests, CTA slots, work items, partial rows (each at least 1)."""

    batch: int
    ctas: int
    items: int
    partial_rows: int


@dataclass(frozen=True)
class _Planned:
    """What ``run()`` launches for the current plan (everything that depends on the lengths, made in ``plan()``)."""

    schedule: Schedule
    batch: int
    max_len: int  # the longest request: run() checks the block table holds it
    grid: tuple[int]  # the partial kernel's
    merge: bool  # launch the merge (always under use_cuda_graph)
    merge_grid: tuple[int, int]
    merge_meta: dict  # BLOCK_S, BLOCK_D, num_warps
    lse_scratch: torch.Tensor  # [batch, heads] fp32: where lse goes when the caller neither gives nor wants it
    q_shape: tuple[int, int, int]  # what run() takes and returns
    out_shape: tuple[int, int, int]


def _seg(n: int) -> int:
    return cdiv(n, _ALIGN) * _ALIGN


class _DecodePlan:
    """What the GQA, MLA and sparse MLA plans share: the capacity, the buffers, ``plan()``, the run checks, the merge
    launch and the timelines."""

    kind: str = ""
    what: str = ""
    lens_name = "seq_lens"  # plan()'s lengths, as refusals name them
    table_name, table_columns = "block_table", "max_pages"  # run()'s table of keys, as refusals name it

    def __init__(self, *, heads: int, kv_heads: int, head_dim_qk: int, head_dim_v: int, page_size: int,
                 dtype: torch.dtype, kv_dtype: torch.dtype, device: torch.device | str, groups: int,
                 scheduler: str, max_batch: int | None, max_items: int | None, max_ctas: int | None,
                 max_partial_rows: int | None, num_splits: int | None, ctas: int | None, use_cuda_graph: bool,
                 device_spec: object, device_schedule: bool = False, pdl: bool = False) -> None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise bad("device", device, "a torch device (e.g. 'cuda', 'cuda:1', 'cpu')") from e
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        _launch.check_launch_device("device", torch.empty(0, device=dev))
        if not isinstance(use_cuda_graph, bool):
            raise bad("use_cuda_graph", use_cuda_graph, "True or False")
        if not isinstance(pdl, bool):
            raise bad("pdl", pdl, "True or False")
        # The merge launched with programmatic dependent launch after the tl tile (worklist.check_pdl: not under
        # the interpreter, which runs the same launches without it).
        self.pdl = _wl.check_pdl("start" if pdl else None, False, self.what)
        self.num_heads, self.num_kv_heads = heads, kv_heads
        self.head_dim_qk, self.head_dim_v = head_dim_qk, head_dim_v
        self.page_size = check_int("page_size", page_size)
        self.dtype, self.kv_dtype, self.device = dtype, kv_dtype, dev
        self.groups = groups  # programs a slot launches: GQA's kv heads, MLA's head tiles
        self.use_cuda_graph = use_cuda_graph
        self.scheduler = scheduler
        self._num_splits, self._ctas = num_splits, ctas
        self.spec = _launch.resolve_device(device_spec) if device_spec is not None else (
            _launch.resolve_device(None, like=torch.empty(0, device=dev)))
        # The scheduler, its knobs and the family checked once, on a batch of one key (cheap).
        if scheduler not in S.NAMES:
            raise bad("scheduler", scheduler, "one of " + ", ".join(S.NAMES))
        S.schedule(self._workload((1,)), self.spec, scheduler, num_splits=num_splits, ctas=ctas)
        # splitlab's scheduler weighs no stream-K for a plan (persistent=False): the plan's kernel runs one item a slot
        self.persistent = scheduler in PERSISTENT_SCHEDULERS
        self.device_schedule = self._check_device_schedule(device_schedule)
        self._want = dict(batch=max_batch, ctas=max_ctas, items=max_items, partial_rows=max_partial_rows)
        for k, v in self._want.items():
            if v is not None:
                self._want[k] = check_int(f"max_{k}", v)
        self.capacity: Capacity | None = None
        self._planned: _Planned | None = None
        self._bound_partial: BoundLaunch | None = None  # run()'s launches (_launch_partial, _merge)
        self._bound_merges: dict[tuple, BoundLaunch] = {}
        if max_batch is not None:
            self._allocate(self._want["batch"])

    def _check_device_schedule(self, on: object) -> bool:
        """``device_schedule``: a bool; True only with ``use_cuda_graph`` (the grid is the capacity) and a scheduler
        the device computes at knobs fixed now (``balanced``'s and ``stream_k``'s CTAs, ``uniform``'s
        ``num_splits``, FlashMLA's SM parts, ``splitlab``'s cost-model terms)."""
        if not isinstance(on, bool):
            raise bad("device_schedule", on, "True or False")
        if not on:
            return False
        name = f"{self.what}(device_schedule=True)"
        if not self.use_cuda_graph:
            raise SplitlabError(f"{name} without use_cuda_graph: the grid must be the capacity (the host never "
                                "learns the schedule); expected use_cuda_graph=True")
        if self.scheduler not in _ds.DEVICE_SCHEDULERS:
            raise SplitlabError(f"{name} with scheduler {self.scheduler!r}; expected one of "
                                f"{', '.join(_ds.DEVICE_SCHEDULERS)} (the schedulers computed on the device)")
        self._pricing: dict[int, _ds.SplitlabPricing] = {}  # splitlab's, by batch size
        # by batch size and reuse: the schedule's launches and run()'s plan, made at their first plan_on_device
        self._device_launches: dict[tuple[int, bool], tuple[_ds.ScheduleLaunch, _Planned]] = {}
        if self.scheduler == "uniform":
            if self._num_splits is None:
                raise SplitlabError(f"{name} with scheduler 'uniform' and no num_splits; expected num_splits (the "
                                    "split-count rule's choice depends on the lengths)")
            from splitlab.planners import splitlab as rule

            self._device_kw = dict(scheduler="uniform", num_splits=self._num_splits,
                                   request_major=rule.REQUEST_MAJOR[self.kind])
        elif self.scheduler == "flashmla":  # its SM parts: the schedule's slots
            self._device_kw = dict(scheduler="flashmla",
                                   ctas=S.flashmla_schedule(self._workload((1,)), self.spec).ctas)
        elif self.scheduler == "splitlab":
            self._device_kw = dict(scheduler="splitlab")
        else:
            n = self._ctas or S.slots_per_group(self._workload((1,)), self.spec)
            self._device_kw = (dict(scheduler="balanced", budget=n) if self.scheduler == "balanced" else
                               dict(scheduler="stream_k", ctas=n))
        return True

    def _splitlab_pricing(self, batch: int) -> _ds.SplitlabPricing:
        """splitlab's device pricing terms and buffers for a batch size, made at its first ``plan_on_device`` (and
        for ``max_batch`` when the buffers are allocated), then reused: same tensors every replay."""
        p = self._pricing.get(batch)
        if p is None:
            from splitlab.planners import splitlab as rule

            c = rule.constants_for(self.spec, self.kind).constants
            p = _ds.splitlab_pricing(self._workload((1,) * batch), self.spec, c, self.capacity.items, self.device)
            self._pricing[batch] = p
        return p

    # --- capacity and buffers ------------------------------------------------------------------------------------
    def _workload(self, lens: Sequence[int]) -> DecodeWorkload:
        """The workload a scheduler plans for (the lengths as given; an all-empty batch is never scheduled)."""
        return DecodeWorkload(kind=self.kind, batch=len(lens), num_q_heads=self.num_heads,
                              num_kv_heads=self.num_kv_heads, head_dim_qk=self.head_dim_qk,
                              head_dim_v=self.head_dim_v, ctx_len=max(max(lens), 1), page_size=self.page_size,
                              dtype=TORCH_DTYPE_NAMES[self.kv_dtype], seq_lens=tuple(lens))

    def capacity_bound(self, batch: int) -> tuple[int, int]:
        """``(ctas, items)``: the most CTA slots and work items the scheduler deals ``batch`` requests on this
        device (for ``splitlab``, the budget it is held to: ``BUDGET_WAVES`` waves of a head group's slots or
        ``BUDGET_SPLITS`` slots a request, whichever is more; for ``uniform`` without ``num_splits``, the rule's split
        limit a request, 128 or 256: a large partial buffer, so pass ``num_splits`` or the capacities)."""
        w, dev, name = self._workload((1,)), self.spec, self.scheduler
        if name == "splitlab":
            c = max(BUDGET_SPLITS * batch, BUDGET_WAVES * S.slots_per_group(w, dev))
            return c, c
        if name == "uniform":
            from splitlab.planners import splitlab as rule

            n = self._num_splits or rule.constants_for(dev, self.kind).constants.max_splits
            return batch * n, batch * n
        if name in ("balanced", "stream_k"):
            n = self._ctas or S.slots_per_group(w, dev)
            # stream_k's slots walk their items, but its all-empty batch is one item a slot (as uniform's)
            return (max(batch, n),) * 2 if name == "balanced" else (max(batch, n), n + batch)
        if name == "flashinfer":  # its budget: blocks_per_sm (2, schedulers.flashinfer's default) x SMs / kv heads
            c = max(batch, max(1, 2 * dev.sm_count // self.num_kv_heads))
            return c, c
        parts = S.flashmla_schedule(w, dev).ctas  # FlashMLA's SM parts (dense, or its sparse decode's)
        # a part's span cuts at most one request more than it holds; slots for one item a request past a capacity
        return max(parts, batch), parts + batch

    def _allocate(self, batch: int) -> None:
        """The buffers, once: the packed work list (``[slot count | partial_offsets | cta_offsets | items]``, each
        segment 128-byte aligned), the partial rows and the lse scratch."""
        ctas, items = self.capacity_bound(batch)
        w = self._want
        cap = Capacity(batch, w["ctas"] or ctas, w["items"] or items, w["partial_rows"] or w["items"] or items)
        if cap.ctas < batch or cap.items < batch:
            raise SplitlabError(f"{self.what}: max_ctas={cap.ctas}, max_items={cap.items} for max_batch={batch}; "
                                "expected both at least max_batch (a request is one item at least)")
        dev = self.device
        # [slot count, status, ..., the memo's batch | the memo's lengths | partial_offsets | cta_offsets | items]:
        # a host plan's copy zeroes everything before partial_offsets, the memo's batch with it
        self._off_po = _ALIGN + _seg(cap.batch)
        self._off_co = self._off_po + _seg(cap.batch + 1)
        self._off_it = self._off_co + _seg(cap.ctas + 1)
        total = self._off_it + 4 * cap.items
        self._meta = torch.zeros(total, dtype=torch.int32, device=dev)
        self._num_ctas = self._meta[:1]
        self._partial_offsets = self._meta[self._off_po:self._off_po + cap.batch + 1]
        self._cta_offsets = self._meta[self._off_co:self._off_co + cap.ctas + 1]
        self._items = self._meta[self._off_it:].view(cap.items, 4)
        self._status = self._meta[1:2]  # plan_on_device's status (device_schedule); 0 after a host plan
        self._memo = self._meta[_ALIGN - 1:_ALIGN + cap.batch]  # plan_on_device(reuse=True)'s kept lengths
        if self.device_schedule:
            self._scratch = torch.zeros(2 * cap.batch, dtype=torch.int32, device=dev)
        if dev.type == "cuda":  # two pinned staging buffers in turn (the module docstring)
            self._staging = [torch.empty(total, dtype=torch.int32, pin_memory=True) for _ in range(2)]
            self._copied: list[torch.cuda.Event | None] = [None, None]
            self._turn = 0
        po = _launch.alloc(cap.partial_rows, self.num_heads, self.head_dim_v, dtype=torch.float32, device=dev)
        check_spans("the partial rows", po, (0, 1, 2))
        self._po = po
        self._pl = _launch.alloc(cap.partial_rows, self.num_heads, dtype=torch.float32, device=dev)
        self._lse = _launch.alloc(cap.batch, self.num_heads, dtype=torch.float32, device=dev)
        self._po_strides, self._pl_strides = tuple(po.stride()), tuple(self._pl.stride())
        # The kernels' bound arguments: none unless the grid is the capacity (the launchers' kernels otherwise).
        self._bounded = dict(num_ctas_ptr=self._num_ctas, BOUNDED=True) if self.use_cuda_graph else {}
        self.capacity = cap
        if self.device_schedule and self.scheduler == "splitlab":
            self._splitlab_pricing(cap.batch)

    # --- plan ----------------------------------------------------------------------------------------------------
    def plan(self, seq_lens: Sequence[int] | torch.Tensor, *, block_table: torch.Tensor | None = None,
             num_pages: int | None = None) -> Schedule:
        """Plan a batch: ``seq_lens`` as host integers (a list or tuple, as a server's scheduler holds them) or a 1-D
        int32 / int64 tensor (read on the host once: one device-to-host sync on a GPU). Validates them once
        (integers >= 0, at least one request, at most ``max_batch``), makes the schedule
        (``planners.schedulers.schedule``; ``splitlab``: within the capacity; a batch whose requests are all empty:
        one empty item each) and copies its work list into the plan's buffers (allocated here at the first plan).
        With ``block_table`` (the table ``run`` will get) the lengths are also checked against its columns, and with
        ``num_pages`` too every entry a request reads against ``[0, num_pages)`` (one more sync). Returns the
        schedule. Refused in one line: a length or batch out of range, a schedule past the capacity, a call while a
        CUDA graph is captured."""
        return self._plan(seq_lens, block_table, num_pages)

    def _plan(self, seq_lens: Sequence[int] | torch.Tensor, table: torch.Tensor | None, bound: int | None) -> Schedule:
        """``plan()``'s body: ``table`` the tensor that holds each request's keys (GQA/MLA's block table, sparse
        MLA's indices) and ``bound`` the range its entries must lie in (pages, slots), checked by ``_check_table``."""
        name = self.lens_name
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A graph would capture the work list's copy (replayed from a staging buffer that has moved on since).
            raise SplitlabError(f"{self.what}.plan while a CUDA graph is captured; expected plan() outside the "
                                "capture, before each replay (run() is what a graph captures)")
        if isinstance(seq_lens, torch.Tensor):
            if seq_lens.dim() != 1 or seq_lens.dtype not in (torch.int32, torch.int64):
                raise SplitlabError(f"{self.what}.plan: {name} is a tensor of shape {tuple(seq_lens.shape)} and "
                                    f"dtype {seq_lens.dtype}; expected a 1-D int32 or int64 tensor (or a list)")
            lens = seq_lens.tolist()  # the one host read (a device-to-host sync for a GPU tensor)
        elif isinstance(seq_lens, list | tuple):
            lens = list(seq_lens)
        else:
            raise SplitlabError(f"{self.what}.plan: {name} is a {type(seq_lens).__name__}; expected a list or "
                                "tuple of ints, or a 1-D int32 tensor")
        if not lens:
            raise SplitlabError(f"{self.what}.plan: {name} is empty; expected at least one request")
        for i, n in enumerate(lens):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise SplitlabError(f"{self.what}.plan: {name}[{i}] = {n!r}; expected an integer >= 0")
        if self.capacity is None:
            self._allocate(len(lens))
        cap = self.capacity
        if len(lens) > cap.batch:
            raise SplitlabError(f"{self.what}.plan: a batch of {len(lens)} requests is past max_batch={cap.batch}; "
                                "expected at most that (make the plan with a larger max_batch)")
        if table is not None:
            self._check_table(lens, table, bound)
        s = self._schedule(lens)
        self._write(s)
        return s

    def plan_on_device(self, seq_lens: torch.Tensor, *, reuse: bool = False) -> None:
        """Plan a batch from device lengths without a host sync (``device_schedule=True``): ``seq_lens`` a 1-D int32
        tensor on the plan's device (padded slots 0), its length the batch. Launches the schedule kernel
        (``kernels.device_schedule``) into the plan's work-list buffers: capturable, so a CUDA graph holds it before
        ``run()``'s kernels and each replay recomputes the schedule for the lengths the tensor then holds (the same
        tensor, the same batch); a strided view is refused (copy it with ``.contiguous()``). Checks only host-visible
        metadata; the buffers are allocated at the first plan (pass ``max_batch``, or make the first call outside a
        capture). A schedule past the capacity (only where
        capacities below ``capacity_bound`` were given) makes every row NaN and ``status`` 1; lengths past the block
        table make their request NaN (``run()`` cannot check them).

        ``reuse=True``: the kernels first compare the lengths with those of the schedule the buffers hold (written by
        an earlier ``plan_on_device(reuse=True)`` of this batch size, with no host ``plan()`` or other
        ``plan_on_device`` since) and, where every one is equal, keep it: each kernel then costs one load and a
        compare (for a caller that plans before every layer of a step, as the launchers' default call does)."""
        if not self.device_schedule:
            raise SplitlabError(f"{self.what}.plan_on_device without device_schedule=True; expected the plan made "
                                "with device_schedule=True (or plan(seq_lens) on the host)")
        if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 \
                or seq_lens.device != self.device or seq_lens.shape[0] < 1 or not seq_lens.is_contiguous():
            got = getattr(seq_lens, "shape", type(seq_lens).__name__)
            if isinstance(seq_lens, torch.Tensor):
                got = f"{seq_lens.dtype} {list(got)} on {seq_lens.device}, stride {seq_lens.stride()}"
            raise SplitlabError(f"{self.what}.plan_on_device: seq_lens must be a non-empty contiguous 1-D int32 "
                                f"tensor on {self.device} (the schedule kernel reads it densely); got {got}")
        B = seq_lens.shape[0]
        ready = self._device_launches.get((B, reuse))
        if ready is not None:  # this batch size's launches and run() plan, made and checked at its first call
            ready[0].launch(seq_lens, bound=BOUND_LAUNCH)
            self._planned = ready[1]
            return
        if self.capacity is None:
            self._allocate(B)
        cap = self.capacity
        if B > cap.batch:
            raise SplitlabError(f"{self.what}.plan_on_device: a batch of {B} requests is past max_batch={cap.batch}; "
                                "expected at most that (make the plan with a larger max_batch)")
        kw = dict(self._device_kw)
        if self.scheduler == "splitlab":
            if B not in self._pricing and _launch.capturing(seq_lens):
                raise SplitlabError(f"{self.what}.plan_on_device: a first plan of {B} requests while a CUDA graph is "
                                    "captured; expected one outside the capture first (it makes the batch size's "
                                    "pricing tensors)")
            kw["pricing"] = self._splitlab_pricing(B)
        launch = _ds.prepare_schedule(seq_lens, self._items, self._cta_offsets, self._partial_offsets[:B + 1],
                                      self._num_ctas, self._status, max_partial_rows=cap.partial_rows,
                                      scratch=self._scratch, max_batch=cap.batch, memo=self._memo[:B + 1],
                                      reuse=reuse, **kw)
        launch.launch(seq_lens, bound=BOUND_LAUNCH)
        # the merge's tile: for the rows a request has under one wave of slots, in chunks of at most that many (any
        # count is merged correctly, in chunks)
        splits = (kw.get("num_splits") or kw.get("budget") or kw.get("ctas")
                  or kw["pricing"].max_splits)
        heads, dv = self.num_heads, self.head_dim_v
        rows = device_merge_rows(B, S.slots_per_group(self._workload((1,)), self.spec))
        block_s, block_d, warps = combine_tile(B, heads, min(splits, cap.partial_rows, rows), dv)
        self._planned = _Planned(
            schedule=None, batch=B, max_len=0, grid=(cap.ctas * self.groups,), merge=True,
            merge_grid=(B * heads, cdiv(dv, block_d)), merge_meta=dict(BLOCK_S=block_s, BLOCK_D=block_d,
                                                                        num_warps=warps),
            lse_scratch=self._lse[:B], q_shape=(B, heads, self.head_dim_qk), out_shape=(B, heads, dv))
        self._device_launches[(B, reuse)] = (launch, self._planned)

    @property
    def status(self) -> torch.Tensor | None:
        """The device status of the last ``plan_on_device`` (int32 ``[1]``: 0 ok, bits ``device_schedule.
        OVER_CAPACITY`` and ``NEGATIVE_LENGTH``); 0 after a host ``plan()``; None before the buffers exist."""
        return None if self.capacity is None else self._status

    def _check_table(self, lens: list[int], block_table: torch.Tensor, num_pages: int | None) -> None:
        _launch.check_tensor("block_table", block_table, 2, dtypes=(torch.int32,), device=self.device)
        cap = block_table.shape[1] * self.page_size
        if max(lens) > cap:
            i = max(range(len(lens)), key=lens.__getitem__)
            raise SplitlabError(f"{self.what}.plan: seq_lens[{i}] = {lens[i]} is past the block table's "
                                f"{block_table.shape[1]} pages of {self.page_size} keys; expected at most {cap}")
        if block_table.shape[0] != len(lens):
            raise SplitlabError(f"{self.what}.plan: block_table has {block_table.shape[0]} rows; expected one per "
                                f"request ({len(lens)})")
        if num_pages is not None:
            t = torch.tensor(lens, dtype=torch.int32, device=self.device)
            _launch.check_paged_values(block_table, t, check_int("num_pages", num_pages), self.page_size)

    def _schedule(self, lens: list[int]) -> Schedule:
        cap = self.capacity
        if max(lens) == 0:  # no workload describes it; one empty item a request (zeros, lse -inf)
            s = S.uniform(lens, 1)
        elif self.scheduler == "splitlab":
            s = S.splitlab(self._workload(lens), self.spec, max_ctas=cap.ctas, max_items=cap.items, persistent=False)
        else:
            s = S.schedule(self._workload(lens), self.spec, self.scheduler, num_splits=self._num_splits,
                           ctas=self._ctas)
        for what, n, c in (("CTA slots", s.ctas, cap.ctas), ("items", len(s.items), cap.items),
                           ("partial rows", s.partial_rows, cap.partial_rows)):
            if n > c:
                knob = {"CTA slots": "max_ctas", "items": "max_items", "partial rows": "max_partial_rows"}[what]
                raise SplitlabError(f"{self.what}.plan: scheduler {s.scheduler!r} deals this batch {n} {what}, past "
                                    f"{knob}={c}; expected at most that (make the plan with a larger {knob})")
        if s.persistent and not self.persistent:
            raise SplitlabError(f"{self.what}.plan: scheduler {s.scheduler!r} made a persistent schedule for a plan "
                                "whose kernel runs one item a slot")
        self._check_align(s)
        return s

    def _check_align(self, s: Schedule) -> None:
        """The kernel's key tile must not cross a page where the schedule's items start off a tile."""
        bn = self.block_n
        if self.page_size % bn == 0 and s.align % bn:
            raise SplitlabError(f"{self.what}.plan: the schedule's items start at multiples of {s.align} keys; "
                                f"block_n={bn} at page_size {self.page_size} needs multiples of {bn} (a smaller "
                                "block_n, or a scheduler aligned to it)")

    def _write(self, s: Schedule) -> None:
        """The work list into the device buffers, one copy; then what ``run()`` launches."""
        cap = self.capacity
        B = s.batch
        head = [s.ctas] + [0] * (self._off_po - 1)
        po = list(s.partial_offsets) + [0] * (self._off_co - self._off_po - B - 1)
        co = list(s.cta_offsets) + [0] * (self._off_it - self._off_co - s.ctas - 1)
        flat = [v for (_, r, b, e), row in zip(s.items, s.item_rows, strict=True) for v in (r, b, e, row)]
        host = array.array("i", head + po + co + flat)
        n = len(host)
        src = torch.frombuffer(host, dtype=torch.int32)
        if self.device.type == "cuda":
            k = self._turn
            self._turn ^= 1
            if self._copied[k] is not None:
                self._copied[k].synchronize()  # that buffer's copy of two plans ago (long done, in a server)
            staging = self._staging[k]
            staging[:n].copy_(src)
            with self._guard():  # the copy and its event on the plan's GPU's current stream
                self._meta[:n].copy_(staging[:n], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
            self._copied[k] = ev
        else:
            self._meta[:n].copy_(src)
        heads, dv = self.num_heads, self.head_dim_v
        block_s, block_d, warps = combine_tile(B, heads, max(s.partials), dv)
        graph = self.use_cuda_graph
        self._planned = _Planned(
            schedule=s, batch=B, max_len=max(s.lengths),
            grid=((cap.ctas if graph else s.ctas) * self.groups,),
            merge=graph or s.partial_rows > 0, merge_grid=(B * heads, cdiv(dv, block_d)),
            merge_meta=dict(BLOCK_S=block_s, BLOCK_D=block_d, num_warps=warps),
            lse_scratch=self._lse[:B], q_shape=(B, heads, self.head_dim_qk), out_shape=(B, heads, dv))

    @property
    def schedule(self) -> Schedule | None:
        """The current plan's schedule (None before the first ``plan()``, and after ``plan_on_device``: the host
        never sees it)."""
        return None if self._planned is None else self._planned.schedule

    # --- run helpers ---------------------------------------------------------------------------------------------
    def _check_common(self, p: _Planned, q: torch.Tensor, block_table: torch.Tensor, out, lse,
                      caches: dict[str, torch.Tensor]) -> None:
        """run()'s checks (``check=True``): host-visible metadata only (no device value is read). Written for speed
        (a few microseconds): plain comparisons, the messages made only on a refusal. ``block_table``: the plan's
        table of keys (``table_name``: sparse MLA's indices, one key a column)."""
        dev = self.device
        table = self.table_name
        for name, t, dtype in (("q", q, self.dtype), (table, block_table, torch.int32),
                               *((n, t, self.kv_dtype) for n, t in caches.items())):
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != dev:
                self._refuse_tensor(name, t, dtype)
        if q.shape != p.q_shape:
            self._refuse_shape("q", q, "[" + ", ".join(map(str, p.q_shape)) + "]")
        if block_table.dim() != 2 or block_table.shape[0] != p.batch:
            self._refuse_shape(table, block_table, f"[{p.batch}, {self.table_columns}]")
        _launch.check_no_grad(q=q, **caches)
        max_keys = block_table.shape[1] * self.page_size
        if p.max_len > max_keys:
            raise SplitlabError(f"{self.what}.run: the plan reads up to key {p.max_len}; {table} holds "
                                f"{max_keys} keys a request")
        check_spans("q", q, (1, 2))
        check_spans(table, block_table, (1,))
        if out is not None:
            check_out("out", out, p.out_shape, (self.dtype,), dev)
            check_spans("out", out, (1, 2))
        if lse is not None:
            check_out("lse", lse, p.out_shape[:2], (torch.float32,), dev)
        if not self.use_cuda_graph and _launch.capturing(q):
            raise SplitlabError(f"{self.what}.run while capturing a CUDA graph with use_cuda_graph=False: the grid is "
                                "the plan's and a later plan() would change it; make the plan with use_cuda_graph=True")

    def _refuse_tensor(self, name: str, t: object, dtype: torch.dtype) -> None:
        what = f"{self.what}.run"
        if not isinstance(t, torch.Tensor):
            raise SplitlabError(f"{what}: {name} is a {type(t).__name__}; expected a torch.Tensor")
        if t.dtype != dtype:
            raise SplitlabError(f"{what}: {name} has dtype {t.dtype}; expected {dtype} (the plan's)")
        raise SplitlabError(f"{what}: {name} is on {t.device}; expected the plan's device {self.device}")

    def _refuse_shape(self, name: str, t: torch.Tensor, want: str) -> None:
        raise SplitlabError(f"{self.what}.run: {name} has shape {tuple(t.shape)}; expected {want} (the plan's batch "
                            "and heads)")

    def _outputs(self, p: _Planned, out, lse, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if out is None:
            out = _launch.alloc(p.batch, self.num_heads, self.head_dim_v, dtype=self.dtype, device=self.device)
        if lse is None:
            lse = _launch.alloc(p.batch, self.num_heads, dtype=torch.float32, device=self.device) if return_lse \
                else p.lse_scratch
        return out, lse

    def _merge(self, p: _Planned, out: torch.Tensor, lse: torch.Tensor, timeline: dict, pdl: bool = False) -> None:
        """The merge launch; ``pdl`` (after the tl tile of a ``pdl`` plan, which lets it launch at its programs'
        start): with programmatic dependent launch, its programs waiting for the partial kernel
        (``workitems._merge_kernel``'s ``WAIT_PRIOR``)."""
        if not p.merge:
            return
        args = (self._po, self._pl, self._partial_offsets, out, lse, self.num_heads, self.head_dim_v,
                *self._po_strides, *self._pl_strides, *out.stride(), *lse.stride())
        if timeline or not BOUND_LAUNCH:
            _wi._merge_kernel[p.merge_grid](*args, **_merge_meta(p, pdl), **timeline)
            return
        key = (pdl, *p.merge_meta.values())  # (the meta dict made only at a new key: run() is the hot path)
        bound = self._bound_merges.get(key)
        if bound is None:
            bound = self._bound_merges[key] = BoundLaunch(_wi._merge_kernel, **_merge_meta(p, pdl))
        bound.launch(p.merge_grid, *args)

    def _timelines(self, p: _Planned, timelines: object, q: torch.Tensor) -> tuple[dict, dict]:
        """The partial kernel's and the merge's timeline arguments (``kernels.timeline``; none without
        ``timelines``). No buffer is refilled between runs: every program of a launch writes its record, a
        ``BOUNDED`` slot past the plan's count marks its own absent, and a run without a merge drops the merge's
        buffer (so no record of an earlier run stands). The buffers are sized to the launch grids (the capacity's
        under ``use_cuda_graph``: allocated at the first run and reused by every later one). Refused in one line:
        anything but a ``Timelines``, and a capture whose buffers do not exist yet (allocating inside a capture
        would give the graph memory the host never set)."""
        if timelines is None:
            return {}, {}
        if not isinstance(timelines, Timelines):
            raise SplitlabError(f"{self.what}.run: timelines={type(timelines).__name__} is not allowed; expected a "
                                "kernels.timeline.Timelines or None")
        programs = dict(partial=p.grid[0], merge=p.merge_grid[0] * p.merge_grid[1] if p.merge else 0)
        if _launch.capturing(q) and not all(timelines.ready(k, n, self.device) for k, n in programs.items() if n):
            raise SplitlabError(f"{self.what}.run: timelines has no buffers for this plan's launches while a CUDA "
                                "graph is captured; expected one run(..., timelines=t) with the same t before the "
                                "capture (it allocates them; the graph then reuses them)")
        part = timelines.args("partial", programs["partial"], self.device)
        merge = timelines.args("merge", programs["merge"], self.device) if p.merge else {}
        if not p.merge:
            timelines.drop("merge")
        return part, merge

    def _walk(self, slots: int) -> torch.Tensor | None:
        """The CTA offsets a persistent Gluon tile walks (None for one item a slot): the whole buffer under a
        capacity grid (programs past the plan's count exit), else the plan's ``slots`` + 1 entries."""
        if not self.persistent:
            return None
        return self._cta_offsets if self.use_cuda_graph else self._cta_offsets[:slots + 1]

    def _guard(self):
        return _launch.device_guard(self.device)

    def _launch_partial(self, fn, grid: tuple[int], args: tuple, part: dict) -> None:
        """The partial kernel ``fn`` at the plan's meta-parameters: through its ``BoundLaunch`` (made at the first
        run, after the capacity fixed ``_bounded``), or Triton's own path with timelines (their arguments change
        per call) or ``BOUND_LAUNCH`` off."""
        if part or not BOUND_LAUNCH:
            fn[grid](*args, **self._meta_kw, **self._bounded, **part)
            return
        if self._bound_partial is None:
            self._bound_partial = BoundLaunch(fn, **self._meta_kw, **self._bounded)
        self._bound_partial.launch(grid, *args)


# =====================================================================================================
# GQA
# =====================================================================================================


class GQADecodePlan(_DecodePlan):
    """Paged GQA/MHA/MQA decode planned once per batch, run once per layer (the module docstring;
    ``kernels.worklist.gqa_decode_scheduled``'s kernels: the Gluon MQA kernel where ``mqa_sm90_ws.use_ws`` says so at
    the plan and ``cache_ok`` at the run, else the tl tile).

    Shapes fixed by the plan: ``num_q_heads`` query heads over ``num_kv_heads`` kv heads of ``head_dim``, caches of
    ``page_size``-key pages, ``dtype`` (q, caches and out), on ``device``. ``scheduler``: a name of
    ``planners.schedulers.NAMES`` (``num_splits`` for ``uniform``, ``ctas`` for ``balanced`` / ``stream_k``), planned
    for ``device_spec`` (a ``DeviceSpec`` or preset name; default: the GPU the plan lives on, the ``h200`` preset on
    the CPU). Capacities ``max_batch``, ``max_ctas``, ``max_items``, ``max_partial_rows`` and ``use_cuda_graph``: the
    module docstring. Tiles ``block_n``, ``num_warps``, ``num_stages`` default as ``kernels.gqa.default_knobs``;
    ``sm_scale`` (default ``1/sqrt(head_dim)``) as ``gqa_decode`` takes it. ``device_schedule``: the schedule computed
    on the device by ``plan_on_device``, ``pdl`` the merge's programmatic dependent launch (the module docstring)."""

    kind = "gqa"
    what = "GQADecodePlan"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *, dtype: torch.dtype,
                 device: torch.device | str, scheduler: str = "splitlab", max_batch: int | None = None,
                 max_items: int | None = None, max_ctas: int | None = None, max_partial_rows: int | None = None,
                 num_splits: int | None = None, ctas: int | None = None, use_cuda_graph: bool = False,
                 device_spec: object = None, block_n: int | None = None, num_warps: int | None = None,
                 num_stages: int | None = None, sm_scale: float | None = None, device_schedule: bool = False,
                 pdl: bool = False) -> None:
        from splitlab.kernels import gqa

        hq, hkv = check_int("num_q_heads", num_q_heads), check_int("num_kv_heads", num_kv_heads)
        D = check_int("head_dim", head_dim)
        if hq % hkv:
            raise SplitlabError(f"num_q_heads={hq} is not allowed with num_kv_heads={hkv}; expected a multiple")
        if dtype not in FLOAT_DTYPES:
            raise bad("dtype", dtype, "one of " + ", ".join(map(str, FLOAT_DTYPES)))
        d = gqa.default_knobs(hq // hkv, D, TORCH_DTYPE_NAMES[dtype])
        self.block_n = check_pow2("block_n", d["block_n"] if block_n is None else block_n, lo=16, hi=256)
        warps = check_pow2("num_warps", d["num_warps"] if num_warps is None else num_warps, lo=1, hi=16)
        stages = check_knob("num_stages", d["num_stages"] if num_stages is None else num_stages, lo=1, hi=8)
        self._qk_scale = _launch.resolve_sm_scale(sm_scale, D) * LOG2E
        upcast = _launch.interpret_upcast(dtype)
        super().__init__(heads=hq, kv_heads=hkv, head_dim_qk=D, head_dim_v=D, page_size=page_size, dtype=dtype,
                         kv_dtype=dtype, device=device, groups=hkv, scheduler=scheduler, max_batch=max_batch,
                         max_items=max_items, max_ctas=max_ctas, max_partial_rows=max_partial_rows,
                         num_splits=num_splits, ctas=ctas, use_cuda_graph=use_cuda_graph, device_spec=device_spec,
                         device_schedule=device_schedule, pdl=pdl)
        self._group = hq // hkv
        # MQA's Gluon tile where in scope (worklist.gqa_decode_scheduled's rule), else the tl tile; each plan's
        # alignment is asked at run() (a page of 16 or 32 keys leaves it to the scheduler, not to _check_align).
        self._ws = mqa_ws.use_ws(dtype, hq, hkv, D, (self.block_n, warps, stages), self.page_size, self.device,
                                 self.persistent, mqa_ws.box_rows(self.page_size))
        self._meta_kw = dict(
            PAGE_SIZE=self.page_size, HEAD_DIM=D, BLOCK_G=max(16, next_power_of_two(self._group)),
            BLOCK_N=self.block_n, BLOCK_D=max(16, next_power_of_two(D)), UPCAST=upcast,
            DOT_PRECISION="ieee" if upcast or dtype == torch.float32 else None, PERSISTENT=self.persistent,
            num_warps=warps, num_stages=stages, **_pdl_trigger(self.pdl))

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, *,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            check: bool = True, timelines: Timelines | None = None):
        """Decode the planned batch: q ``[B, Hq, D]``, k_cache / v_cache ``[num_pages, page_size, Hkv, D]``,
        block_table ``[B, max_pages]`` int32 (any strides), B the plan's batch; returns out ``[B, Hq, D]`` (a new
        tensor unless ``out`` is given) or ``(out, lse)`` (lse fp32 ``[B, Hq]``, natural log, ``-inf`` for an empty
        request). ``gqa_decode``'s results for the plan's lengths; no host sync, no planning, nothing read from the
        device. ``check`` (default): the tensors' types, dtypes, devices and shapes against the plan's, the block
        table against the longest request, no grad, and no capture without ``use_cuda_graph``, each refusal one
        line; ``check=False`` skips them (what is passed must then be right: a wrong shape reads out of bounds).
        Lengths past the table were refused by ``plan(block_table=...)`` or, unchecked, make their request NaN.
        ``timelines`` (a ``kernels.timeline.Timelines``): each program of the partial kernel and the merge records
        its SM, start, end and work there (``Timelines.read`` after the launch; ``_timelines`` says how the buffers
        are kept so that a CUDA graph can capture an instrumented step); without it, the plain launch."""
        p = self._planned
        if p is None:
            raise SplitlabError(f"{self.what}.run before plan(); expected plan(seq_lens) first")
        if check:
            self._check_common(p, q, block_table, out, lse, dict(k_cache=k_cache, v_cache=v_cache))
            for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
                if t.dim() != 4 or tuple(t.shape[1:]) != (self.page_size, self.num_kv_heads, self.head_dim_qk) \
                        or t.shape[0] < 1:
                    raise SplitlabError(f"{self.what}.run: {name} has shape {tuple(t.shape)}; expected [num_pages "
                                        f">= 1, {self.page_size}, {self.num_kv_heads}, {self.head_dim_qk}]")
                check_spans(name, t, (1, 3))
        out, lse = self._outputs(p, out, lse, return_lse)
        with self._guard():
            part, merge = self._timelines(p, timelines, q)
            if self._ws and (p.schedule is None or p.schedule.align % mqa_ws.box_rows(self.page_size) == 0) \
                    and mqa_ws.cache_ok(k_cache, v_cache):
                mqa_ws.launch(q, k_cache, v_cache, block_table, self._items, p.grid[0], out, lse, self._po, self._pl,
                              self._qk_scale, num_ctas=self._num_ctas if self.use_cuda_graph else None,
                              timeline=part or None, cta_offsets=self._walk(p.grid[0]), bound=BOUND_LAUNCH)
                self._merge(p, out, lse, merge)
                return (out, lse) if return_lse else out
            self._launch_partial(_wl._gqa_worklist_kernel, p.grid, (
                q, k_cache, v_cache, block_table, self._items, self._cta_offsets, out, lse, self._po, self._pl,
                self._qk_scale, self.num_kv_heads, self._group, k_cache.shape[0],
                block_table.shape[1] * self.page_size,
                *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(),
                *out.stride(), *lse.stride(), *self._po_strides, *self._pl_strides), part)
            self._merge(p, out, lse, merge, self.pdl)
        return (out, lse) if return_lse else out


def _merge_meta(p: _Planned, pdl: bool) -> dict:
    """The merge's meta-parameters for plan ``p``; with ``pdl``, launched by programmatic dependent launch, its
    programs waiting for the partial kernel (``workitems._merge_kernel``'s ``WAIT_PRIOR``)."""
    return dict(p.merge_meta, WAIT_PRIOR=True, launch_pdl=True) if pdl else p.merge_meta


def _pdl_trigger(pdl: bool) -> dict:
    """The work-list tl kernels' constexpr under a ``pdl`` plan: let the merge launch at each program's start (the
    trigger that paid on the H200: ``experiments/short_launch``)."""
    return dict(LAUNCH_DEPENDENTS=1) if pdl else {}


def _latent_scales(dtype: torch.dtype, kv_dtype: torch.dtype | None, kv_scale: float | None,
                   sm_scale: float | None, head_dim_qk: int) -> tuple[torch.dtype, float, float]:
    """``(kv_dtype, qk_scale, kv_scale)`` of a latent-cache plan (MLA, sparse MLA): q's ``dtype`` a float dtype,
    the cache's ``kv_dtype`` (default q's; fp8 beside a 16-bit q) and ``kv_scale`` checked as the launchers check them
    (``_launch.check_kv_dtype``, on two empty stand-ins), the scores' scale ``sm_scale * kv_scale * log2(e)``."""
    if dtype not in FLOAT_DTYPES:
        raise bad("dtype", dtype, "one of " + ", ".join(map(str, FLOAT_DTYPES)))
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if kv_dtype not in (*FLOAT_DTYPES, FP8_KV_DTYPE):
        raise bad("kv_dtype", kv_dtype, f"one of {', '.join(map(str, FLOAT_DTYPES))}, {FP8_KV_DTYPE}")
    kv_scale = _launch.check_kv_dtype(torch.empty(0, dtype=dtype), torch.empty(0, dtype=kv_dtype), kv_scale)
    scale = _launch.resolve_sm_scale(sm_scale, head_dim_qk, kv_scale=kv_scale)
    return kv_dtype, scale * kv_scale * LOG2E, kv_scale


# =====================================================================================================
# MLA (the tl tile, or FlashMLA's schedule in Gluon: mla_sm90_ws)
# =====================================================================================================


class MLADecodePlan(_DecodePlan):
    """Absorbed MLA decode over a paged latent cache, planned once per batch, run once per layer (the module
    docstring; ``kernels.worklist.mla_decode_scheduled``'s kernels: FlashMLA's schedule in Gluon where
    ``mla_sm90_ws.use_ws`` says so at the plan and ``cache_ok`` at the run, else the tl tile).

    Shapes fixed by the plan: ``num_heads`` query heads, latent rows of ``head_dim_qk`` (K) whose first
    ``head_dim_v`` columns are V, ``page_size``-key pages, ``dtype`` (q and out) and ``kv_dtype`` (the cache: q's
    dtype, or ``torch.float8_e4m3fn`` beside a 16-bit q, dequantised by ``kv_scale``), on ``device``. Tiles
    ``block_h``, ``block_n``, ``num_warps``, ``num_stages`` default as ``kernels.mla.mla_defaults``; the rest as
    ``GQADecodePlan``."""

    kind = "mla"
    what = "MLADecodePlan"

    def __init__(self, num_heads: int, head_dim_qk: int, head_dim_v: int, page_size: int, *, dtype: torch.dtype,
                 device: torch.device | str, kv_dtype: torch.dtype | None = None, kv_scale: float | None = None,
                 scheduler: str = "splitlab", max_batch: int | None = None, max_items: int | None = None,
                 max_ctas: int | None = None, max_partial_rows: int | None = None, num_splits: int | None = None,
                 ctas: int | None = None, use_cuda_graph: bool = False, device_spec: object = None,
                 block_n: int | None = None, block_h: int | None = None, num_warps: int | None = None,
                 num_stages: int | None = None, sm_scale: float | None = None, device_schedule: bool = False,
                 pdl: bool = False) -> None:
        from splitlab.kernels import mla

        H, Dqk = check_int("num_heads", num_heads), check_int("head_dim_qk", head_dim_qk)
        Dv = check_knob("head_dim_v", head_dim_v, lo=1, hi=Dqk)
        kv_dtype, self._qk_scale, self._kv_scale = _latent_scales(dtype, kv_dtype, kv_scale, sm_scale, Dqk)
        d = mla.mla_defaults(H, Dqk, TORCH_DTYPE_NAMES[kv_dtype], head_dim_v=Dv,
                             block_h=None if block_h is None else check_pow2("block_h", block_h, lo=16, hi=64),
                             block_n=None if block_n is None else check_pow2("block_n", block_n, lo=16, hi=256))
        warps = d.num_warps if num_warps is None else mla.check_num_warps(num_warps)
        stages = d.num_stages if num_stages is None else check_knob("num_stages", num_stages, lo=1, hi=8)
        self.block_n, self.block_h = d.block_n, d.block_h
        tiles = cdiv(H, d.block_h)
        super().__init__(heads=H, kv_heads=1, head_dim_qk=Dqk, head_dim_v=Dv, page_size=page_size, dtype=dtype,
                         kv_dtype=kv_dtype, device=device, groups=tiles, scheduler=scheduler, max_batch=max_batch,
                         max_items=max_items, max_ctas=max_ctas, max_partial_rows=max_partial_rows,
                         num_splits=num_splits, ctas=ctas, use_cuda_graph=use_cuda_graph, device_spec=device_spec,
                         device_schedule=device_schedule, pdl=pdl)
        # FlashMLA's schedule in Gluon where in scope (worklist.mla_decode_scheduled's rule), else the tl tile.
        self._ws = ws.use_ws(dtype, kv_dtype, Dqk, Dv, (d.block_h, d.block_n, warps, stages), self.page_size,
                             self.device, self.persistent, d.block_n)
        block_dv, block_dr = mla.padded_dims(Dqk, Dv)
        self._meta_kw = dict(
            PAGE_SIZE=self.page_size, HEAD_DIM_V=Dv, HEAD_DIM_R=Dqk - Dv, BLOCK_H=d.block_h, BLOCK_N=d.block_n,
            BLOCK_DV=block_dv, BLOCK_DR=max(block_dr, mla.MIN_DOT), UPCAST=_launch.interpret_upcast(dtype),
            DOT_PRECISION=_launch.dot_input_precision(dtype), ISOLATE_QK=mla.isolate_qk(d.block_h, warps, dtype),
            KV_FP8=kv_dtype == FP8_KV_DTYPE, FP8_QK=mla.fp8_qk_on(kv_dtype, d.block_h), PERSISTENT=self.persistent,
            num_warps=warps, num_stages=stages, **_pdl_trigger(self.pdl))

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, *,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            check: bool = True, timelines: Timelines | None = None):
        """Decode the planned batch: q ``[B, H, Dqk]``, kv_cache ``[num_pages, page_size, Dqk]``, block_table
        ``[B, max_pages]`` int32 (any strides); returns out ``[B, H, Dv]`` or ``(out, lse)``, as
        ``GQADecodePlan.run`` (``mla_decode``'s results for the plan's lengths; ``timelines`` as there)."""
        p = self._planned
        if p is None:
            raise SplitlabError(f"{self.what}.run before plan(); expected plan(seq_lens) first")
        if check:
            self._check_common(p, q, block_table, out, lse, dict(kv_cache=kv_cache))
            if kv_cache.dim() != 3 or tuple(kv_cache.shape[1:]) != (self.page_size, self.head_dim_qk):
                raise SplitlabError(f"{self.what}.run: kv_cache has shape {tuple(kv_cache.shape)}; expected "
                                    f"[num_pages, {self.page_size}, {self.head_dim_qk}]")
            check_spans("kv_cache", kv_cache, (1, 2))
        out, lse = self._outputs(p, out, lse, return_lse)
        num_pages = kv_cache.shape[0]
        with self._guard():
            part, merge = self._timelines(p, timelines, q)
            if self._ws and ws.cache_ok(kv_cache):
                ws.launch(q, kv_cache, block_table, self._items, p.grid[0] // self.groups, out, lse, self._po,
                          self._pl, self._qk_scale, ws.variant_for(self.persistent),
                          num_ctas=self._num_ctas if self.use_cuda_graph else None, timeline=part or None,
                          cta_offsets=self._walk(p.grid[0] // self.groups), bound=BOUND_LAUNCH)
                self._merge(p, out, lse, merge)
                return (out, lse) if return_lse else out
            self._launch_partial(_wl._mla_worklist_kernel, p.grid, (
                q, kv_cache, block_table, self._items, self._cta_offsets, out, lse, self._po, self._pl,
                self.num_heads, self.groups, self._qk_scale, self._kv_scale, num_pages,
                block_table.shape[1] * self.page_size if num_pages else 0,
                *q.stride(), *kv_cache.stride(), *block_table.stride(), *out.stride(), *lse.stride(),
                *self._po_strides, *self._pl_strides), part)
            self._merge(p, out, lse, merge, self.pdl)
        return (out, lse) if return_lse else out


# =====================================================================================================
# Sparse MLA (the top-k gather work-list kernel: kernels.sparse_mla)
# =====================================================================================================


class SparseMLADecodePlan(_DecodePlan):
    """Sparse top-k MLA decode over a token pool, planned once per batch, run once per layer (the module docstring;
    ``kernels.sparse_mla.sparse_mla_decode_scheduled``'s kernel, the tl tile).

    A request is a query token and its keys are the positions of its index row: ``plan(topk_lens)`` takes how many
    positions each token walks (its top-k, or its valid prefix as FlashMLA's sparse ``topk_length``; positions past
    it are never read), ``run(q, kv_cache, indices)`` gathers the latent rows ``indices`` names (-1 skipped). Shapes
    fixed by the plan: ``num_heads`` query heads, latent rows of ``head_dim_qk`` (K) whose first ``head_dim_v`` columns
    are V, ``dtype`` (q and out) and ``kv_dtype`` (the pool: q's dtype, or ``torch.float8_e4m3fn`` beside a 16-bit q,
    dequantised by ``kv_scale``), on ``device``. Schedulers: ``planners.schedulers.names_for('sparse_mla')``. Tiles
    ``block_h``, ``block_k``, ``num_warps`` default as ``kernels.sparse_mla.sparse_mla_defaults``; the rest as
    ``GQADecodePlan``. ``device_schedule=True`` with ``plan_on_device(topk_lens)`` (the module docstring): schedulers
    ``balanced``, ``uniform`` (at a ``num_splits``) and ``stream_k``, the host's work list bit for bit; ``splitlab``
    and ``flashmla`` refused in one line (splitlab's device pricing is made from a dense workload's lengths; FlashMLA's
    device walk is checked against its dense schedules only). ``flashmla`` on the host: FlashMLA's sparse decode
    schedule (64 or 128 heads)."""

    kind = "sparse_mla"
    what = "SparseMLADecodePlan"
    lens_name = "topk_lens"
    table_name, table_columns = "indices", "topk"

    def __init__(self, num_heads: int, head_dim_qk: int, head_dim_v: int, *, dtype: torch.dtype,
                 device: torch.device | str, kv_dtype: torch.dtype | None = None, kv_scale: float | None = None,
                 scheduler: str = "splitlab", max_batch: int | None = None, max_items: int | None = None,
                 max_ctas: int | None = None, max_partial_rows: int | None = None, num_splits: int | None = None,
                 ctas: int | None = None, use_cuda_graph: bool = False, device_spec: object = None,
                 block_k: int | None = None, block_h: int | None = None, num_warps: int | None = None,
                 sm_scale: float | None = None, device_schedule: bool = False) -> None:
        from splitlab.kernels import sparse_mla

        H, Dqk = check_int("num_heads", num_heads), check_int("head_dim_qk", head_dim_qk)
        Dv = check_knob("head_dim_v", head_dim_v, lo=1, hi=Dqk)
        kv_dtype, self._qk_scale, self._kv_scale = _latent_scales(dtype, kv_dtype, kv_scale, sm_scale, Dqk)
        d, meta = sparse_mla.worklist_meta(H, Dqk, Dv, dtype, kv_dtype, block_h=block_h, block_k=block_k,
                                           num_warps=num_warps, persistent=scheduler in PERSISTENT_SCHEDULERS)
        self.block_n, self.block_h = d.block_n, d.block_h  # block_n: the key tile (BLOCK_K)
        # page_size 1: a token's keys are its index row's columns, one a column
        super().__init__(heads=H, kv_heads=1, head_dim_qk=Dqk, head_dim_v=Dv, page_size=1, dtype=dtype,
                         kv_dtype=kv_dtype, device=device, groups=cdiv(H, d.block_h), scheduler=scheduler,
                         max_batch=max_batch, max_items=max_items, max_ctas=max_ctas,
                         max_partial_rows=max_partial_rows, num_splits=num_splits, ctas=ctas,
                         use_cuda_graph=use_cuda_graph, device_spec=device_spec, device_schedule=device_schedule)
        self._meta_kw = meta

    def _check_device_schedule(self, on: object) -> bool:
        """As the other plans', but for ``splitlab`` (its device pricing makes its candidates from a dense
        workload's lengths, ``device_schedule.splitlab_pricing``, not a sparse one's) and ``flashmla`` (its device
        walk is checked against the dense scheduler only)."""
        if on is True and self.scheduler in ("splitlab", "flashmla"):
            raise SplitlabError(f"{self.what}(device_schedule=True) with scheduler {self.scheduler!r}; expected "
                                "balanced, uniform or stream_k (the device schedulers checked for sparse workloads)")
        return super()._check_device_schedule(on)

    def _workload(self, lens: Sequence[int]) -> DecodeWorkload:
        """The sparse workload a scheduler plans for: a token per request, ``topk`` its longest walk, the walked
        lengths as its ``seq_lens``."""
        n = max(max(lens), 1)
        return DecodeWorkload(kind=self.kind, batch=len(lens), num_q_heads=self.num_heads, num_kv_heads=1,
                              head_dim_qk=self.head_dim_qk, head_dim_v=self.head_dim_v, ctx_len=n, page_size=1,
                              topk=n, dtype=TORCH_DTYPE_NAMES[self.kv_dtype], seq_lens=tuple(lens))

    def plan(self, topk_lens: Sequence[int] | torch.Tensor, *, indices: torch.Tensor | None = None,
             num_slots: int | None = None) -> Schedule:
        """Plan a batch of query tokens: ``topk_lens`` the positions each token walks (host integers or a 1-D int32 /
        int64 tensor, read once), as ``GQADecodePlan.plan`` takes ``seq_lens``. With ``indices`` (the ``[T, topk]``
        int32 rows ``run`` will get) the lengths are also checked against its columns, and with ``num_slots`` too
        every walked index against ``[-1, num_slots)`` (one more sync). Returns the schedule; refusals as there."""
        return self._plan(topk_lens, indices, num_slots)

    def _check_table(self, lens: list[int], indices: torch.Tensor, num_slots: int | None) -> None:
        from splitlab.kernels import sparse_mla

        _launch.check_tensor("indices", indices, 2, dtypes=(torch.int32,), device=self.device)
        if max(lens) > indices.shape[1]:
            i = max(range(len(lens)), key=lens.__getitem__)
            raise SplitlabError(f"{self.what}.plan: topk_lens[{i}] = {lens[i]} is past indices' {indices.shape[1]} "
                                f"columns; expected at most {indices.shape[1]}")
        if indices.shape[0] != len(lens):
            raise SplitlabError(f"{self.what}.plan: indices has {indices.shape[0]} rows; expected one per token "
                                f"({len(lens)})")
        if num_slots is not None:
            _launch.check_indices(sparse_mla.walked_indices(indices, tuple(lens)),
                                  check_int("num_slots", num_slots, minimum=0))

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            check: bool = True, timelines: Timelines | None = None):
        """Decode the planned tokens: q ``[T, H, Dqk]``, kv_cache ``[num_slots, Dqk]``, indices ``[T, topk]`` int32
        (any strides; -1 no key); returns out ``[T, H, Dv]`` or ``(out, lse)``, as ``GQADecodePlan.run``
        (``sparse_mla_decode_scheduled``'s results for the plan's walked lengths, without its index check: an index
        outside ``[-1, num_slots)`` is never gathered and makes its token NaN; ``plan(indices=, num_slots=)`` checks
        them; ``timelines`` as there)."""
        p = self._planned
        if p is None:
            raise SplitlabError(f"{self.what}.run before plan(); expected plan(topk_lens) first")
        if check:
            self._check_common(p, q, indices, out, lse, dict(kv_cache=kv_cache))
            if kv_cache.dim() != 2 or kv_cache.shape[1] != self.head_dim_qk:
                raise SplitlabError(f"{self.what}.run: kv_cache has shape {tuple(kv_cache.shape)}; expected "
                                    f"[num_slots, {self.head_dim_qk}]")
            check_spans("kv_cache", kv_cache, (1,))
        out, lse = self._outputs(p, out, lse, return_lse)
        from splitlab.kernels.sparse_mla import _sparse_mla_worklist_kernel

        with self._guard():
            part, merge = self._timelines(p, timelines, q)
            self._launch_partial(_sparse_mla_worklist_kernel, p.grid, (
                q, kv_cache, indices, self._items, self._cta_offsets, out, lse, self._po, self._pl,
                self.num_heads, self.groups, self._qk_scale, self._kv_scale, kv_cache.shape[0], indices.shape[1],
                *q.stride(), *kv_cache.stride(), *indices.stride(), *out.stride(), *lse.stride(),
                *self._po_strides, *self._pl_strides), part)
            self._merge(p, out, lse, merge)
        return (out, lse) if return_lse else out
