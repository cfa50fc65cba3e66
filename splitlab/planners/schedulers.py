"""Schedulers: functions of plain numbers that turn a batch's lengths into a ``Schedule`` (``planners.schedule``).

* ``uniform``: every request in ``num_splits`` equal, tile-aligned chunks, issued split-major (every request's
  first chunk, then every second, ...): what splitlab's kernels ran before schedules, one item per CTA.
* ``flashmla``: FlashMLA's ``get_mla_metadata`` (``planners.flashmla``, ported exactly): each of ``num_sm_parts``
  persistent CTAs takes an equal payload of 64-key blocks plus a fixed overhead per request span; one item per
  (SM part, request span).
* ``flashinfer``: FlashInfer's tensor-core decode plan (``PrefillPlan``: the smallest KV chunk, in pages, whose
  chunks fit ``2 * SMs / kv heads`` CTAs; ``planners.flashinfer.prefill_kv_chunk_pages``), one chunk per CTA.
* ``stream_k``: LeanAttention's stream-K: every persistent CTA streams the same number of key tiles of the
  batch laid end to end (its span may cross requests), so no CTA waits on a long request's chunk.
* ``balanced``: every request in chunks of one size, the smallest whose chunk count fits a CTA budget (FlashInfer's
  rule, in key tiles).
* ``splitlab``: the candidate of ``uniform``, ``balanced`` and ``stream_k`` of least modelled makespan under the
  fitted cost model (``splitlab`` below).

Every scheduler returns a checked schedule (``Schedule.check``). Sources are cited per function. Sparse MLA takes
``splitlab``, ``uniform``, ``balanced`` and ``stream_k`` (``names_for``): a query token is a request and the positions
of its top-k list it walks are its keys (``w.lengths``: ``topk``, or each token's valid prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest
from typing import NamedTuple

from splitlab.errors import SplitlabError, bad, check_int
from splitlab.intmath import cdiv
from splitlab.planners.schedule import Item, Schedule, chunks, make

#: Keys per tile the dense kernels stream (and the alignment of every item a scheduler below makes).
TILE_KEYS = 64


def _lengths(lengths: Sequence[int]) -> list[int]:
    out = [check_int("seq_lens[i]", n, minimum=0) for n in lengths]
    if not out:
        raise bad("seq_lens", list(lengths), "at least one request")
    return out


def uniform(lengths: Sequence[int], num_splits: int, *, tile: int = TILE_KEYS,
            request_major: bool = False) -> Schedule:
    """Request ``i`` in ``num_splits`` chunks of ``cdiv(cdiv(L_i, num_splits), tile) * tile`` keys (the last ones
    shorter, or absent where the request runs out of keys), one per CTA, in the order the split-count kernels' grids
    issue them: split-major (chunk 0 of every request, then chunk 1: ``kernels.gqa.GRID_ORDER``) or, with
    ``request_major``, a request's chunks together (``kernels.mla.GRID_ORDER``). Source: splitlab."""
    lens = _lengths(lengths)
    num_splits = check_int("num_splits", num_splits)
    tile = check_int("tile", tile)
    per = [cdiv(cdiv(n, num_splits), tile) * tile for n in lens]
    order = ([(r, s) for r in range(len(lens)) for s in range(num_splits)] if request_major else
             [(r, s) for s in range(num_splits) for r in range(len(lens))])
    items: list[Item] = []
    for r, s in order:
        n = lens[r]
        if n == 0:
            if s == 0:
                items.append((-1, r, 0, 0))
        elif s * per[r] < n:
            items.append((-1, r, s * per[r], min((s + 1) * per[r], n)))
    return make("uniform", lens, items, align=tile, num_splits=num_splits, request_major=request_major)


def by_chunk(lengths: Sequence[int], chunk_keys: int, *, name: str = "balanced", align: int = TILE_KEYS,
             **params: object) -> Schedule:
    """Every request in consecutive chunks of ``chunk_keys`` keys, one per CTA, request-major (a request's chunks
    together, as FlashInfer's ``DecodeSplitKVIndptr`` and ``PrefillSplitQOKVIndptr`` lay them out)."""
    lens = _lengths(lengths)
    chunk_keys = check_int("chunk_keys", chunk_keys)
    items = [(-1, r, b, e) for r, n in enumerate(lens) for b, e in chunks(n, chunk_keys)]
    return make(name, lens, items, align=align, chunk_keys=chunk_keys, **params)


def smallest_chunk(tiles: Sequence[int], budget: int, low: int = 1) -> int:
    """The smallest chunk (in tiles, at least ``low``) whose chunk count ``sum(cdiv(max(t, 1), chunk))`` fits
    ``budget``, by FlashInfer's binary search (``PrefillBinarySearchKVChunkSize``: ``low`` to the longest
    request; the longest is returned where nothing smaller fits)."""
    hi = max(max(tiles), low)
    lo = low
    shifted = [max(t, 1) - 1 for t in tiles]  # cdiv(t, mid) = (t - 1) // mid + 1 for t >= 1, inlined: a plan's hot loop
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(t // mid for t in shifted) + len(shifted) > budget:
            lo = mid + 1
        else:
            hi = mid
    return lo


def balanced(lengths: Sequence[int], budget: int, *, tile: int = TILE_KEYS) -> Schedule:
    """Every request in chunks of the smallest whole number of ``tile``-key tiles whose chunk count fits ``budget``
    CTAs (``smallest_chunk``); one chunk per CTA. FlashInfer's balanced chunk search, in the kernel's key tiles
    rather than pages. Source: splitlab, after flashinfer-ai/flashinfer ``scheduler.cuh``."""
    lens = _lengths(lengths)
    budget = check_int("budget", budget)
    tiles = [cdiv(n, tile) for n in lens]
    chunk = smallest_chunk(tiles, budget)
    return by_chunk(lens, chunk * tile, name="balanced", align=tile, budget=budget)


def flashinfer(lengths: Sequence[int], *, page_size: int, num_kv_heads: int, sm_count: int,
               blocks_per_sm: int = 2) -> Schedule:
    """FlashInfer's tensor-core paged decode plan (``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)``,
    one query token per request, no CUDA-graph padding): ``budget = blocks_per_sm * sm_count // num_kv_heads``
    CTAs per kv head; the smallest chunk in pages from ``max(128 // page_size, 1)`` whose chunks fit it; each request
    in chunks of that many pages, one per CTA (a request without keys one empty chunk). ``blocks_per_sm`` is the
    plan's assumption of two CTAs per SM. Source: flashinfer-python 0.7.2.post1
    ``include/flashinfer/attention/scheduler.cuh`` (``PrefillPlan``, ``PrefillSplitQOKVIndptr``,
    ``PrefillBinarySearchKVChunkSize``), the version the peer cards run; for groups above 16 query rows per kv head
    FlashInfer also tiles the queries (``cta_tile_q``), which this port leaves out (one query tile)."""
    lens = _lengths(lengths)
    page_size = check_int("page_size", page_size)
    budget = max(1, check_int("blocks_per_sm", blocks_per_sm) * check_int("sm_count", sm_count)
                 // check_int("num_kv_heads", num_kv_heads))
    pages = [cdiv(n, page_size) for n in lens]
    chunk = smallest_chunk(pages, budget, low=max(128 // page_size, 1))
    return by_chunk(lens, chunk * page_size, name="flashinfer", align=page_size, chunk_pages=chunk, budget=budget)


#: FlashMLA's dense decode scheduler block (keys) and fixed overhead per request span (blocks):
#: ``csrc/api/dense_decode.h``'s ``block_size_n`` and ``fixed_overhead_num_blocks`` (``planners.flashmla``).
FLASHMLA_BLOCK_N, FLASHMLA_OVERHEAD = 64, 5


def flashmla(lengths: Sequence[int], num_sm_parts: int, *, block_size_n: int = FLASHMLA_BLOCK_N,
             fixed_overhead_num_blocks: int = FLASHMLA_OVERHEAD) -> Schedule:
    """FlashMLA's decode schedule: ``get_mla_metadata`` (``planners.flashmla``, ported exactly) turned into items,
    one per (SM part, request span): part ``p`` runs request ``begin_req_idx``'s blocks from ``begin_block_idx``,
    the requests between whole, and ``end_req_idx``'s blocks up to ``end_block_idx``; a span is keys ``[block *
    block_size_n, min(end_block * block_size_n, L))``. ``ctas`` is ``num_sm_parts`` (trailing parts may run
    nothing). Source: deepseek-ai/FlashMLA ``csrc/smxx/decode/get_decoding_sched_meta`` @ 9241ae3e."""
    from splitlab.planners.flashmla import get_mla_metadata

    lens = _lengths(lengths)
    meta, prefix = get_mla_metadata(lens, num_sm_parts, block_size_n, fixed_overhead_num_blocks)
    blocks = [max(n - 1, 0) // block_size_n + 1 for n in lens]
    items: list[Item] = []
    for p, m in enumerate(meta):
        if m.empty:
            continue
        for r in range(m.begin_req_idx, m.end_req_idx + 1):
            b0 = m.begin_block_idx if r == m.begin_req_idx else 0
            b1 = m.end_block_idx if r == m.end_req_idx else blocks[r]
            if lens[r] == 0:
                items.append((p, r, 0, 0))
            elif b1 > b0:
                items.append((p, r, b0 * block_size_n, min(b1 * block_size_n, lens[r])))
    s = make("flashmla", lens, items, persistent=True, align=block_size_n, ctas=num_sm_parts,
             num_sm_parts=num_sm_parts, block_size_n=block_size_n, overhead=fixed_overhead_num_blocks)
    if tuple(prefix[i + 1] - prefix[i] for i in range(len(lens))) != s.partials:
        raise SplitlabError("flashmla schedule: items disagree with get_mla_metadata's split counts")
    return s


def stream_k(lengths: Sequence[int], ctas: int, *, tile: int = TILE_KEYS) -> Schedule:
    """Stream-K (LeanAttention): the batch's key tiles laid end to end, request after request, and cut into
    ``ctas`` spans of ``T // ctas`` or one more tiles (``T`` the batch's tiles; the first ``T % ctas`` spans take
    the extra one); each persistent CTA runs its span's pieces of the requests it crosses, in order. A request
    without keys is one empty item of the CTA whose span holds its place. Source: Sanovar et al., "Lean Attention:
    Hardware-Aware Scalable Attention Mechanism for the Decode-Phase of Transformers" (arXiv 2405.10480), section
    4; splitlab's port cuts at key tiles."""
    lens = _lengths(lengths)
    ctas = check_int("ctas", ctas)
    tile = check_int("tile", tile)
    tiles = [cdiv(n, tile) for n in lens]
    total = sum(tiles)
    ctas = max(1, min(ctas, total)) if total else 1
    q, extra = divmod(total, ctas)
    bounds = [0]
    for c in range(ctas):
        bounds.append(bounds[-1] + q + (c < extra))
    items: list[Item] = []
    pos, c = 0, 0  # pos: the first tile of request r in the batch's tile order
    for r, (n, t) in enumerate(zip(lens, tiles, strict=True)):
        if t == 0:
            while c < ctas - 1 and bounds[c + 1] <= pos:
                c += 1
            items.append((c, r, 0, 0))
            continue
        lo, hi = pos, pos + t
        while lo < hi:
            while bounds[c + 1] <= lo:
                c += 1
            e = min(hi, bounds[c + 1])
            items.append((c, r, (lo - pos) * tile, min((e - pos) * tile, n)))
            lo = e
        pos = hi
    return make("stream_k", lens, items, persistent=True, align=tile, ctas=ctas)


#: Schedulers by name (``splitlab schedule --scheduler``; ``schedule`` dispatches on it).
NAMES = ("splitlab", "uniform", "balanced", "stream_k", "flashinfer", "flashmla")
#: The schedulers that stand for one library's plan, the kinds they plan, and why another kind is refused. FlashMLA
#: schedules sparse decode as dense, each query token a request of its top-k (or valid prefix) keys, with the sparse
#: implementation's SM parts and overhead (``flashmla_schedule``).
LIBRARY_KINDS = {"flashinfer": ("gqa",), "flashmla": ("mla", "sparse_mla")}
REFUSED = {"flashinfer": "FlashInfer's paged GQA decode plan",
           "flashmla": "FlashMLA's dense and sparse MLA decode schedulers"}


def names_for(kind: str) -> tuple[str, ...]:
    """The schedulers (``NAMES``) that plan workloads of ``kind``: every one but the library plans of other
    kinds (``LIBRARY_KINDS``)."""
    return tuple(n for n in NAMES if kind in LIBRARY_KINDS.get(n, (kind,)))


# =====================================================================================================
# splitlab's own: the candidate of least modelled makespan under the fitted cost model
# =====================================================================================================

#: Wave multiples the balanced candidates aim at (CTAs = m x the slots a head group has).
BALANCED_WAVES = (1, 2, 3, 4, 6, 8)
#: Wave multiples of the stream-K candidates, weighed where the tile's ``persistent_cost`` is fitted (> 0): one wave.
#: Stream-K runs on the persistent work-list kernel (a loop over a slot's items around the key loop; on sm_90a,
#: triton 3.6: 158 registers for GQA's 16-row tile against 103, 255 with spills for MQA-128's and MLA's tiles), whose
#: key tile the constants price apart (``CostConstants.persistent``, ``persistent_wide``: experiments/schedules/
#: refit.py). Of the stream-K schedules timed on the H200 (1 and 2 waves), one wave was the faster on every batch.
STREAM_K_WAVES: tuple[int, ...] = (1,)


def item_fixed(c: object) -> float:
    """The work-list kernels' fixed cost per item (key tiles of one CTA) under constants ``c``: ``item_fixed`` where
    fitted over schedule runs, else the split-count kernels' FIXED."""
    return c.item_fixed or c.fixed


def persistent_cost(w: object, c: object) -> float:
    """The persistent kernel's key tile in the one-item kernel's for ``w``'s tile under constants ``c``
    (``persistent_wide`` for wide tiles, ``persistent`` else); 0: not fitted, stream-K is not weighed."""
    from splitlab.planners import splitlab as rule

    return c.persistent_wide if rule.wide_tile(w, rule.tile_rows(w)) else c.persistent


def ctas_per_sm(w: object, c: object) -> int:
    """CTAs of ``w``'s tile an SM runs at once under the fitted constants ``c`` (the wave width
    ``planners.splitlab.fitted_cost`` takes: wide, mid or narrow tile)."""
    from splitlab.planners import splitlab as rule

    rows = rule.tile_rows(w)
    if rule.wide_tile(w, rows):
        return c.ctas_per_sm
    return c.ctas_per_sm_mid if rule.mid_tile(w, rows) and c.ctas_per_sm_mid > 0 else c.ctas_per_sm_narrow


def head_groups(w: object, block_h: int | None = None) -> int:
    """Programs a slot launches: GQA's kv heads, MLA's head tiles (``waves.ctas`` of one request, one split)."""
    from splitlab import waves

    return waves.ctas(w, 1, block_h=block_h) // w.batch


def modelled_time(s: Schedule, w: object, sm_count: int, c: object, arch: str = "") -> float:
    """The modelled time of ``s`` for workload ``w`` (its kind, heads, dims) on ``sm_count`` SMs under the fitted
    constants ``c`` (``CostConstants``), in key tiles of one CTA (a modelled figure, not a time):

        launch = ragged_launch_time over the slots' programs, in slot order, each streaming its items' key tiles
                 at the tile's rate plus FIXED per item (``item_fixed``: the work-list kernels' own where fitted; a
                 persistent slot pays it for every item it starts, and its key tiles cost ``persistent_cost`` each
                 where that is fitted)
        + PARTIAL x P x ceil(partial rows x head groups / SMs)        (the busiest SM's partial-row writes)
        + (partial rows > 0) x (COMBINE + COMBINE_PER_SPLIT x partial rows x head groups x P / SMs)   (the merge)

    with the wave width, tile rate, drain cap and P of ``planners.splitlab.fitted_cost``, so that a uniform schedule
    is priced as the split-count rule prices it where ``item_fixed`` is not fitted. Source: splitlab."""
    t = _terms(w, sm_count, arch, c)
    per_cta = [s.cta_offsets[i + 1] - s.cta_offsets[i] for i in range(s.ctas)]
    busy = [x for x, n in zip(slot_tiles(s, w, c, t.rate), per_cta, strict=True) if n]
    return _priced(busy, s.partial_rows, t.h, t.slots, t.rate, t.cap, t.p, sm_count, c)


def slot_tiles(s: Schedule, w: object, c: object, rate: float) -> list[float]:
    """Each CTA slot's modelled key tiles (``modelled_time``'s): its items' key tiles, times ``persistent_cost`` in
    a persistent schedule where that is fitted, plus FIXED / rate for every item after its first."""
    from splitlab.planners import splitlab as rule

    k = (persistent_cost(w, c) or 1.0) if s.persistent else 1.0
    per_cta = [s.cta_offsets[i + 1] - s.cta_offsets[i] for i in range(s.ctas)]
    f = item_fixed(c)
    return [k * t + max(n - 1, 0) * f / rate for t, n in zip(s.cta_tiles(rule.TILE_KEYS), per_cta, strict=True)]


#: The relative margin by which a candidate's floor must exceed the best price for ``splitlab`` to skip pricing it.
FLOOR_MARGIN = 1e-9


def _priced(busy: list[float] | tuple[int, int, int], partial_rows: int, h: int, slots: int, rate: float, cap: float,
            p: float, sm_count: int, c: object) -> float:
    """``modelled_time``'s sum, given the busy slots' key tiles in issue order and the partial rows; given instead
    ``(slots busy, their key tiles, the longest's)``, a floor under it (``planners.splitlab.ragged_launch_floor``
    for the launch, the same partial terms)."""
    from splitlab.planners import splitlab as rule

    if isinstance(busy, tuple):
        launch = rule.ragged_launch_floor(*busy, h, 1, slots, rate, item_fixed(c), cap) if busy[0] else 0.0
    else:
        launch = rule.ragged_launch_time(busy, h, 1, slots, rate, item_fixed(c), cap, request_major=True) if busy \
            else 0.0
    if partial_rows:
        launch += c.partial * p * cdiv(partial_rows * h, sm_count)
        launch += c.combine + c.combine_per_split * partial_rows * h * p / sm_count
    return launch


def _uniform_shape(lens: Sequence[int], num_splits: int, tile: int = TILE_KEYS) -> tuple[tuple[int, int, int], int]:
    """``((CTAs, key tiles, the longest CTA's), partial rows)`` of ``_uniform_tiles(lens, num_splits, ...)`` without
    its list (either order): a request of n keys is ``cdiv(n, tile)`` tiles (one for an empty one) in
    ``cdiv(n, per)`` chunks of ``per`` keys."""
    ctas = total = longest = rows = 0
    for n in lens:
        if not n:
            ctas, total, longest = ctas + 1, total + 1, max(longest, 1)
            continue
        per = cdiv(cdiv(n, num_splits), tile) * tile
        k, tiles = cdiv(n, per), cdiv(n, tile)
        ctas, total, longest = ctas + k, total + tiles, max(longest, per // tile if k > 1 else tiles)
        rows += k if k > 1 else 0
    return (ctas, total, longest), rows


def _balanced_shape(lens: Sequence[int], budget: int, tile: int = TILE_KEYS) -> tuple[tuple[int, int, int], int]:
    """``_uniform_shape``'s numbers for ``_balanced_tiles(lens, budget)``."""
    t = [cdiv(n, tile) for n in lens]
    chunk = smallest_chunk(t, budget)
    ctas = total = longest = rows = 0
    for n in t:
        k = cdiv(max(n, 1), chunk)
        ctas, total, longest = ctas + k, total + max(n, 1), max(longest, chunk if k > 1 else max(n, 1))
        rows += k if k > 1 else 0
    return (ctas, total, longest), rows


def _uniform_tiles(lens: Sequence[int], num_splits: int, request_major: bool, tile: int = TILE_KEYS
                   ) -> tuple[list[int], int]:
    """(each CTA's key tiles in issue order, partial rows) of ``uniform(lens, num_splits, request_major=...)``,
    without building it (an empty request's item counts one tile, as ``Schedule.cta_tiles`` counts it)."""
    per_request = []  # each request's chunks' key tiles: whole chunks of `per` keys, then the rest
    for n in lens:
        per = cdiv(cdiv(n, num_splits), tile) * tile
        full, rest = divmod(n, per) if n else (0, 1)
        per_request.append([per // tile] * full + ([cdiv(rest, tile)] if rest else []))
    if request_major:
        tiles = [t for c in per_request for t in c]
    else:  # split-major: every request's first chunk, then every second chunk, ...
        tiles = [t for k in zip_longest(*per_request) for t in k if t is not None]
    return tiles, sum(len(c) for c in per_request if len(c) > 1)


def _balanced_tiles(lens: Sequence[int], budget: int, tile: int = TILE_KEYS) -> tuple[list[int], int]:
    """(each CTA's key tiles in issue order, partial rows) of ``balanced(lens, budget)``, without building it."""
    t = [cdiv(n, tile) for n in lens]
    chunk = smallest_chunk(t, budget)
    tiles: list[int] = []
    rows = 0
    for n in t:
        k = cdiv(max(n, 1), chunk)
        tiles += [chunk] * (k - 1) + [max(n - (k - 1) * chunk, 1)]
        rows += k if k > 1 else 0
    return tiles, rows


def candidates(w: object, sm_count: int, c: object) -> list[Schedule]:
    """The schedules splitlab's scheduler weighs for ``w``: ``uniform`` at the split-count rule's candidates (in the
    family's grid order), and ``balanced`` and ``stream_k`` at ``BALANCED_WAVES`` / ``STREAM_K_WAVES`` times the
    slots a head group has."""
    from splitlab.planners import splitlab as rule

    lens = list(w.lengths)
    major = rule.REQUEST_MAJOR[w.kind]
    out = [uniform(lens, n, request_major=major) for n in rule.split_candidates(w, c.max_splits, sm_count)]
    base = max(1, sm_count * ctas_per_sm(w, c) // head_groups(w))
    budgets = sorted({max(1, m * base) for m in BALANCED_WAVES})
    out += [balanced(lens, b) for b in budgets if b >= w.batch]
    if persistent_cost(w, c) > 0:
        out += [stream_k(lens, max(1, m * base)) for m in STREAM_K_WAVES]
    return out


class SplitlabTerms(NamedTuple):
    """What ``splitlab``'s scheduler prices every candidate with that does not depend on the lengths (only on the
    workload's shape and batch, the device and the constants): the head groups ``h``, the CTA ``slots``, the tile
    ``rate``, the drain ``cap``, the partial tiles ``p``, the SMs, the wave ``base`` (slots a head group has), the
    family's grid order and the balanced budgets weighed (``BALANCED_WAVES`` x base, at least the batch).
    ``kernels.device_schedule`` passes them to the device."""

    h: int
    slots: int
    rate: float
    cap: float
    p: float
    sm_count: int
    base: int
    request_major: bool
    budgets: tuple[int, ...]


def splitlab_terms(w: object, dev: object, c: object) -> SplitlabTerms:
    """``SplitlabTerms`` for workload ``w`` (its shape and batch) on ``dev`` under constants ``c``: the terms of
    ``modelled_time``, computed once."""
    return _terms(w, dev.sm_count, dev.arch, c)


def _terms(w: object, sm_count: int, arch: str, c: object) -> SplitlabTerms:
    from splitlab.planners import splitlab as rule

    rows_ = rule.tile_rows(w)
    wide = rule.wide_tile(w, rows_)
    mid = rule.mid_tile(w, rows_) and c.ctas_per_sm_mid > 0
    slots = sm_count * ctas_per_sm(w, c)
    scale = c.ctas_per_sm_narrow / c.ctas_per_sm_mid if mid else 1.0
    lone = min(1.0, c.lone * scale) if c.lone >= 0 else 1.0
    cap = 1.0 if wide else min(1.0, c.drain * scale) if c.drain >= 0 else lone
    rate = rule._tile_rate(w, rows_, arch, None, c)
    h, p = head_groups(w), rule.partial_tiles(w, None, arch)
    base = max(1, sm_count * ctas_per_sm(w, c) // h)
    budgets = tuple(b for b in sorted({max(1, m * base) for m in BALANCED_WAVES}) if b >= w.batch)
    return SplitlabTerms(h, slots, rate, cap, p, sm_count, base, rule.REQUEST_MAJOR[w.kind], budgets)


def splitlab(w: object, dev: object, constants: object = None, *, max_ctas: int | None = None,
             max_items: int | None = None, persistent: bool = True) -> Schedule:
    """splitlab's scheduler: of ``candidates``, the schedule of least ``modelled_time`` on ``dev`` (ties: fewer
    partial rows, then fewer items), with the family's fitted constants for ``dev``
    (``planners.splitlab.constants_for``) unless ``constants`` are given. Source: splitlab.

    ``max_ctas`` / ``max_items`` (a work-list buffer's capacity, ``kernels.decode_plan``): candidates with more CTA
    slots or items are left out; ``uniform`` at one split (one item a request) fits any capacity of at least the
    batch, a smaller one is one ``SplitlabError``. ``persistent=False`` (a kernel that runs one item a slot, as a
    plan's and the device scheduler's) leaves stream-K out."""
    from splitlab.planners import splitlab as rule

    c = rule.constants_for(dev, w.kind).constants if constants is None else constants
    lens = list(w.lengths)
    # Every candidate is priced from its parameters (one item a CTA: the key tiles of each, in issue order) and only
    # the winner is built: the same choice as pricing ``candidates``' schedules (tests/test_schedules.py), in a
    # fraction of the time (a plan is made once per decode step).
    terms = splitlab_terms(w, dev, c)
    h, slots, rate, cap, p = terms.h, terms.slots, terms.rate, terms.cap, terms.p
    major = terms.request_major
    specs = [("uniform", n, _uniform_shape(lens, n)) for n in rule.split_candidates(w, c.max_splits, dev.sm_count)]
    specs += [("balanced", b, _balanced_shape(lens, b)) for b in terms.budgets]
    tiles_of = {"uniform": lambda n: _uniform_tiles(lens, n, major)[0],
                "balanced": lambda b: _balanced_tiles(lens, b)[0]}
    # Priced in the order of a floor under each price (from its CTA count, key tiles and longest CTA alone), and only
    # while a floor is below the best price so far (FLOOR_MARGIN absorbs rounding): a candidate left out cannot win,
    # so the choice is the one pricing them all in order makes (the key ends with the candidate's index: ties to the
    # first), at a fraction of the tile lists and list schedules.
    todo = []
    for i, (name, arg, (shape, prows)) in enumerate(specs):
        if (max_ctas is not None and shape[0] > max_ctas) or (max_items is not None and shape[0] > max_items):
            continue
        todo.append((_priced(shape, prows, h, slots, rate, cap, p, dev.sm_count, c), i, name, arg, prows))
    best, key = None, None
    for low, i, name, arg, prows in sorted(todo, key=lambda t: t[:2]):
        if key is not None and low > key[0] * (1 + FLOOR_MARGIN):
            break
        busy = [t * 1.0 for t in tiles_of[name](arg)]
        k = (_priced(busy, prows, h, slots, rate, cap, p, dev.sm_count, c), prows, len(busy), i)
        if key is None or k < key:
            best, key = (name, arg), k
    for j, m in enumerate(STREAM_K_WAVES if persistent and persistent_cost(w, c) > 0 else ()):  # priced on the
        sk = stream_k(lens, max(1, m * terms.base))  # built schedule, after the others (ties to the first)
        if (max_ctas is None or sk.ctas <= max_ctas) and (max_items is None or len(sk.items) <= max_items):
            k = (modelled_time(sk, w, dev.sm_count, c, dev.arch), sk.partial_rows, len(sk.items), len(specs) + j)
            if key is None or k < key:
                best, key = ("stream_k", max(1, m * terms.base)), k
    if best is None:
        raise SplitlabError(f"scheduler splitlab: no candidate fits max_ctas={max_ctas}, max_items={max_items} for "
                            f"{w.batch} requests; expected capacities of at least the batch")
    build = {"uniform": lambda n: uniform(lens, n, request_major=major), "balanced": lambda b: balanced(lens, b),
             "stream_k": lambda n: stream_k(lens, n)}
    s = build[best[0]](best[1])
    return Schedule(s.scheduler, s.lengths, s.ctas, s.items, s.persistent, s.align,
                    dict(s.params, chosen_by="splitlab", modelled=round(key[0], 2)))


def slots_per_group(w: object, dev: object, c: object = None) -> int:
    """CTA slots per head group on ``dev`` (SMs x the tile's CTAs per SM, over the head groups): the CTA count
    ``stream_k`` and ``balanced`` default to."""
    from splitlab.planners import splitlab as rule

    c = rule.constants_for(dev, w.kind).constants if c is None else c
    return max(1, dev.sm_count * ctas_per_sm(w, c) // head_groups(w))


def schedule(w: object, dev: object, name: str = "splitlab", *, num_splits: int | None = None,
             ctas: int | None = None) -> Schedule:
    """The schedule scheduler ``name`` (``NAMES``) makes for workload ``w`` on ``dev``: ``uniform`` at
    ``num_splits`` (default: the ``splitlab`` planner's split count), ``balanced`` and ``stream_k`` over ``ctas``
    CTAs per head group (default: ``slots_per_group``), ``flashinfer`` (GQA) and ``flashmla`` (MLA, sparse MLA) as their
    libraries plan on ``dev``'s SMs, ``splitlab`` by its cost model. A knob the scheduler does not take, or a
    family it does not cover, is one ``SplitlabError``."""
    if name not in NAMES:
        raise bad("scheduler", name, "one of " + ", ".join(NAMES))
    if name not in names_for(w.kind):
        raise SplitlabError(f"scheduler {name!r} is not allowed for kind {w.kind}; expected one of "
                            f"{', '.join(names_for(w.kind))} ({REFUSED[name]})")
    if num_splits is not None and name != "uniform":
        raise SplitlabError(f"--num-splits is not allowed with scheduler {name!r}; expected it with uniform")
    if ctas is not None and name not in ("balanced", "stream_k"):
        raise SplitlabError(f"--ctas is not allowed with scheduler {name!r}; expected it with balanced or stream_k")
    lens = list(w.lengths)
    if name == "splitlab":
        return splitlab(w, dev)
    if name == "uniform":
        if num_splits is None:
            from splitlab.planners.registry import plan

            num_splits = plan(w, dev, "splitlab").num_splits
        from splitlab.planners import splitlab as rule

        return uniform(lens, num_splits, request_major=rule.REQUEST_MAJOR[w.kind])
    if name in ("balanced", "stream_k"):
        n = slots_per_group(w, dev) if ctas is None else check_int("ctas", ctas)
        return balanced(lens, n) if name == "balanced" else stream_k(lens, n)
    if name == "flashinfer":
        return flashinfer(lens, page_size=w.page_size, num_kv_heads=w.num_kv_heads, sm_count=dev.sm_count)
    return flashmla_schedule(w, dev)


def flashmla_schedule(w: object, dev: object) -> Schedule:
    """FlashMLA's schedule of ``w`` on ``dev``: dense MLA over ``num_sm_parts(SMs, H, 1)`` parts, 64-key blocks,
    overhead 5; sparse MLA (``kind`` ``sparse_mla``, 64 or 128 heads) as FlashMLA's sparse decode schedules it, each
    token a request whose ``s_k`` is its walked top-k (``w.lengths``; a 0 counts one block, as upstream's 0 -> 1), over
    the ``DecodeImplMeta`` of SM90 (or SM100 on ``sm_100`` devices): ``sms / (H / 64)`` parts, 64-key blocks, overhead
    5. Source: deepseek-ai/FlashMLA ``csrc/api/dense_decode.h`` and ``csrc/api/sparse_decode.h`` @ 9241ae3e
    (``planners.flashmla``)."""
    from splitlab.planners import flashmla as port

    lens = list(w.lengths)
    if w.kind != "sparse_mla":
        return flashmla(lens, port.num_sm_parts(dev.sm_count, w.num_q_heads, w.num_kv_heads))
    meta = port.sparse_decode_impl_meta(dev.sm_count, w.num_q_heads, 1, w.head_dim_qk,
                                        "sm_100" if dev.arch == "sm_100" else "sm_90")
    return flashmla(lens, meta.num_sm_parts, block_size_n=meta.block_size_topk,
                    fixed_overhead_num_blocks=meta.fixed_overhead_num_blocks)
