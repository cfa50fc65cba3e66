"""splitlab's own planner: a wave-aware cost model, the same for every kernel family.

The registered ``splitlab`` planner is the *fitted* rule at the bottom of this module (``fitted_plan``; its
constants are data, one file per device: ``constants_for``, ``use_constants``, ``planners.fitted``). The first,
unfitted rule follows; it is kept as ``plan_splitlab_v0`` (what the shipped H200 data call ``splitlab``) and its
``modelled_cost`` drives the sweep's fake timer.

First rule (one line): pick the split count ``s`` that minimises the modelled time

    T(s) = ceil(c0 * s / (sm_count * ctas_per_sm)) * (ceil(L / s) + KEYS_FIXED)   # partial waves
           + COMBINE_KEYS * (s > 1) + COMBINE_PER_SPLIT * s * c0 / sm_count      # the merge

in units of "keys streamed by one CTA", where ``c0`` is the CTAs of the unsplit launch (``waves.ctas``),
``L`` the longest request's keys (``topk`` for sparse MLA) and ``KEYS_FIXED`` the per-CTA start-up cost
(launch, Q load, epilogue) expressed in keys. Candidates are powers of two up to ``V0_MAX_SPLITS`` and never
more splits than ``ceil(L / MIN_KEYS_PER_SPLIT)``; ties go to fewer splits.

Its constants are a reasoned setting, not a fit (one CTA per SM for the large-tile MLA kernels, two for GQA; a
CTA's fixed cost of about one 128-key tile); the fitted rule below replaces them with constants fitted on
measured data (``splitlab.fit``). Source: splitlab (this repository), no upstream.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path

from splitlab import waves
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError
from splitlab.intmath import cdiv, next_power_of_two
from splitlab.planners import fitted
from splitlab.planners.fitted import CostConstants, FittedConstants
from splitlab.planners.registry import Plan, register
from splitlab.workloads import KINDS, DecodeWorkload

#: The split range per family: the kernel cards' ``num_splits`` range (``kernels/*.toml``; a test holds them equal),
#: what the sweeps time. The fitted rule and ``splitlab.fit`` search up to it: nothing beyond it was measured.
MAX_SPLITS = fitted.MAX_SPLITS  # (defined there: a constants file's max_splits is held to it)
#: The first rule's own range: GQA to 64 splits, the GQA card's range when that rule was written (MQA-128 at one
#: request and 64K-128K keys, fastest at 128 splits, widened the card later). Kept so that ``plan_splitlab_v0``
#: still makes the choices the shipped sweeps tag it with.
V0_MAX_SPLITS = MAX_SPLITS | {"gqa": 64}
#: The model's terms per family (every kind of ``splitlab.families``: tests/test_families.py holds these tables, and
#: ``REQUEST_MAJOR`` below, to it; docs/extending.md).
MIN_KEYS_PER_SPLIT = {"gqa": 64, "mla": 64, "sparse_mla": 64}
CTAS_PER_SM = {"gqa": 2, "mla": 1, "sparse_mla": 1}
KEYS_FIXED = {"gqa": 128, "mla": 128, "sparse_mla": 128}
COMBINE_KEYS = 64.0  # the second launch, in keys of one CTA
COMBINE_PER_SPLIT = 2.0  # reading one split's partial row, in keys of one CTA


def modelled_cost(w: DecodeWorkload, num_splits: int, sm_count: int) -> float:
    """``T(s)`` of the rule above, in keys streamed by one CTA (a modelled figure, not a time)."""
    kind = w.kind
    c0 = waves.ctas(w, 1)
    keys = w.keys_per_request
    n_waves = cdiv(c0 * num_splits, sm_count * CTAS_PER_SM[kind])
    t = n_waves * (cdiv(keys, num_splits) + KEYS_FIXED[kind])
    if num_splits > 1:
        t += COMBINE_KEYS + COMBINE_PER_SPLIT * num_splits * c0 / sm_count
    return t


def splitlab_num_splits(w: DecodeWorkload, sm_count: int) -> int:
    """The split count the rule picks for ``w`` on ``sm_count`` SMs."""
    keys = w.keys_per_request
    limit = max(1, min(V0_MAX_SPLITS[w.kind], cdiv(keys, MIN_KEYS_PER_SPLIT[w.kind])))
    best, best_cost = 1, modelled_cost(w, 1, sm_count)
    s = 2
    while s <= limit:
        cost = modelled_cost(w, s, sm_count)
        if cost < best_cost:
            best, best_cost = s, cost
        s *= 2
    return best


def plan_splitlab_v0(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """splitlab's first, unfitted wave-cost rule (what the older shipped sweeps tag ``splitlab``; not registered:
    ``splitlab`` is the fitted rule below, scored against this one by ``splitlab.fit``). Tiles are left to the
    kernel's defaults."""
    return Plan("splitlab-v0", splitlab_num_splits(w, dev.sm_count),
                note=f"wave-cost model over powers of two, {CTAS_PER_SM[w.kind]} CTA(s) per SM")


# =====================================================================================================
# splitlab (registered): the same wave-cost model with its constants fitted per device (splitlab fit).
# It is the registered ``splitlab`` because it beats the rule above and every ported planner on the held-out
# geomean regret of all three families (BENCHMARKS.md, the planner regret table).
# =====================================================================================================
#
# Rule, per family, in "key tiles streamed by one CTA" (a tile = TILE_KEYS keys):
#
#     waves(s)   = ceil(c0 * s / (sm_count * CTAS_PER_SM[tile]))    # c0: CTAs of the unsplit launch; with
#                  TAIL < 1 a partly filled last wave costs TAIL + (1 - TAIL) x its filled fraction (>= 1 wave);
#                  with LONE >= 0 a narrow-tile launch under one wave costs max(LONE, its filled fraction,
#                  DRAIN x ceil(c0 * s / sm_count) / CTAS_PER_SM_NARROW: its busiest SM, where DRAIN >= 0)
#     T(s)       = waves(s) * (ceil(ceil(L / s) / KEYS) * RATE + FIXED)  # each wave streams its split's tiles
#                  + (s > 1) * PARTIAL * P * ceil(c0 * s / sm_count)    # the busiest SM's CTAs write their partials
#                  + (s > 1) * (COMBINE + COMBINE_PER_SPLIT * s * c0 * P / sm_count)   # the merge launch
#
# where P (``partial_tiles``) is one split's partial output (tile rows x Dv values, plus the lse) in key tiles of
# the same program's KV reads: a physical ratio, not fitted (0.06 for GQA 32/8, 2 for MQA-128's 128 rows; for an
# MLA BLOCK_H 64 tile 1.8 in fp32, 0.9 where the Gluon tile runs, whose partials are bf16: ``partial_bytes``). It
# is what makes many splits costly when the tile has many rows: a split writes, and the merge reads back, as many
# bytes as it streamed. The writes are counted per CTA on the busiest SM, not per wave: two narrow CTAs that share
# an SM in one wave write twice the rows (counted per wave, the second CTA's write is free, and MLA-16/32 at one
# request takes 256 splits, two CTAs per SM, where 128 run 1.08-1.11x faster). For a wide tile (one CTA per SM,
# whole waves) the two counts agree. KEYS is the key tile (TILE_KEYS, 64; sparse MLA's BLOCK_K 32 where the rule
# weighs it) and RATE its cost in 64-key tiles of the tl kernel: 1, but SM90_TILE
# for the Gluon 64-row tile (``sm90_tile_runs``: sm_90, a 16-bit cache, 64 keys), NARROW for sparse MLA's 16-row
# tile in place of a wider one and SMALL_KEY_TILE for a 32-key tile.
#
# and ``num_splits = argmin T(s)`` over the powers of two, the wave-filling split counts (``floor(m * SMs /
# c0)``, m = 1..8: ``waves.wave_fill_splits``) and the limit itself, s <= min(MAX_SPLITS, ceil(L / min(KEYS,
# MIN_KEYS_PER_SPLIT))) (one key tile a split: top-k 384 has 6 tiles, and 6 splits beat 4 by 1.3x on the H200),
# ties to fewer splits. CTAS_PER_SM is how many CTAs an SM runs at once (the wave width), one value for a
# *wide* tile (MLA/sparse BLOCK_H 64, sparse MLA's 32-row tile, 8 warps like its 64-row one, GQA's 8-warp tile of
# MQA-128: ``wide_tile``), one for a *narrow* tile (16/32 rows: MLA-16/32, sparse BLOCK_H 16, GQA's 16-row tile)
# and, where fitted, one for GQA's 4-warp 32- and 64-row tiles (``mid_tile``, CTAS_PER_SM_MID); FIXED a CTA's
# start-up and epilogue, COMBINE the second launch, COMBINE_PER_SPLIT reading one split's partial rows per
# SM: every constant is a time in tiles of one CTA, so the rule needs no device bandwidth.
#
# A ragged batch (requests of different lengths; not sparse MLA, whose kernel walks every top-k slot of a token)
# replaces waves(s) * (tiles + FIXED) by a schedule of its CTAs (``ragged_launch_time``): request i's CTAs stream
# ceil(ceil(L_i / s) / KEYS) tiles, are issued in the kernel's grid order (``REQUEST_MAJOR``) into the slots and
# stream at their share of the bandwidth, a narrow one up to 1 / DRAIN times faster as the launch drains; the
# launch ends with its last CTA. LONE and DRAIN are in waves of the narrow tile; a mid tile takes them over its own
# slots (LONE x CTAS_PER_SM_NARROW CTAs on an SM keep its bandwidth busy, whatever their rows).
#
# Sparse MLA also picks the head tile: its default (BLOCK_H 32/64) or 16, whichever has the lower T(s) over
# its own split candidates, where a 16-row tile's key tiles cost NARROW (``narrow_tile``, fitted 0.8 of the tl
# kernel's; 0: never weighed) and its c0, P and wave width are those of 16 rows. With the Gluon tile's SM90_TILE
# (fitted 0.6) the 16-row tile replaces the tl 32-row tile (32 heads) at every token count, a tl 64-row tile (a
# GPU without the Gluon kernel) too, and the Gluon tile only in the smallest launches (1-4 tokens at top-k 512,
# 1 token at 2048 on the H200), where 64-row tiles leave most SMs idle. (16 heads have only the 16-row tile.)
# Sparse MLA also picks BLOCK_K (Dqk <= 512 only; wider rows keep the kernel's default) at 16 heads
# (``key_tiles``): 64, or 32 where T(s) is lower, a 32-key tile costing SMALL_KEY_TILE (fitted 0.6) of a 64-key
# one. Twice the tiles at 0.6 each never pay in full waves; they pay where one 64-key tile a split still leaves
# the launch under a wave, by halving the tile and doubling the splits (1-4 tokens: 1.06-1.17x). Seed 003's
# "BLOCK_K 32 once CTAs exceed the SMs" is the opposite rule: it does not carry over (README).
# MLA picks the head tile at 17-32 heads: the tl 32-row default, whose key tiles cost TILE32 (fitted 2, in 16-row
# tiles), or the Gluon 64-row tile at SM90_TILE (``head_tiles`` says why no other). Tiles are otherwise the
# kernels' defaults: the data measure other BLOCK_N only on a few shapes, where replay could not score them.
#
# The constants are data: ``splitlab fit --out FILE`` writes them (grid searches minimising the geomean regret of
# ``splitlab.analysis.replay`` over the *fit* shapes of ``splitlab.scoring.held_out``), one file per device. The shipped
# ``constants/h200-sxm.toml`` is that command's output on the catalog's fit set (``data/catalog.toml``: ``h200``, the
# sixth kernel version of all three families on the H200, sparse MLA timed over input sets rotated by the rows a
# call reads; ``tests/test_fit.py`` holds the two equal). GQA's and MLA's first pass, MLA's and sparse MLA's head-
# tile passes, sparse MLA's key-tile pass and GQA's and MLA's ragged passes (CTAS_PER_SM_MID, then FIXED, PARTIAL
# and DRAIN on same-length and ragged shapes) are ``splitlab.fit``'s; sparse MLA's merge costs are held physical
# (``fit.PHYSICAL``). Held-out
# shapes never entered the fit; the catalog's confirm set (``h200-confirm``: shapes in no fit and no held-out set,
# chosen and swept after the rule was final) scores it afterwards; the file records both scores.

TILE_KEYS = 64
SMALL_TILE_KEYS = 32  # sparse MLA's other key tile (BLOCK_K 32)


#: The device whose constants the rule takes where none were fitted for the device it plans for (stated in the
#: plan's note, in ``splitlab plan`` and once as a warning from a launcher): the one splitlab measured.
FALLBACK_DEVICE = "h200-sxm"
#: Constants files (``splitlab fit --out``; several separated by ``os.pathsep``) the launchers' planner takes, each
#: for the device it was fitted for, in place of that device's shipped ones (``use_constants`` is the same from
#: Python; ``splitlab plan --constants`` from the command line).
ENV_CONSTANTS = "SPLITLAB_CONSTANTS"

# What the H200's constants (constants/h200-sxm.toml) say, family by family:
# - GQA/MQA (memory-bound): the wave width is what the kernel's resources allow: one MQA-128 CTA per SM (8 warps, a
#   128 x 128 fp32 accumulator), two 4-warp 32/64-row CTAs, three 16-row CTAs (72 KiB of shared memory each at 3
#   stages); a narrow CTA alone in a draining ragged launch streams up to 1 / ``drain`` faster. A launch under one
#   wave of 16-row CTAs costs its fill, but at least ``lone`` of a wave (the bandwidth is not saturated below about
#   two CTAs per SM); a partly filled last wave after full ones costs ``tail`` of a wave plus its filled part. A
#   CTA costs ``fixed`` key tiles of start-up, a split ``partial`` times its partial-row write (P: 0.06 tiles for
#   32/8, 2 for MQA-128's 128 rows), the merge ``combine_per_split`` P per split and SM.
# - MLA: BLOCK_H 64 (64/128 heads) aims at one wave, BLOCK_H 16/32 at two (seed 000's two-wave target for few
#   heads); a split costs ``partial`` times its partial-row write (written, then read back by the merge), the merge
#   a share of P per split and SM (P in the partials' own bytes: bf16 where the Gluon tile runs). The 32-row tile
#   streams a key tile in twice the 16-row tile's time and the Gluon tile in the same, so 17-32 heads take the
#   64-row tile.
# - Sparse MLA: the same wave widths (its 32-row tile, 8 warps, takes the wide one: ``wide_tile``); a split writes
#   its partial rows once (P) and the merge reads them back once at full bandwidth (1 P per split and SM): both held
#   at these physical values, not fitted (``fit.PHYSICAL``). The head tile: a 16-row tile streams a key tile in
#   ``narrow_tile`` of the tl 32/64-row tile's time and the Gluon 64-row tile in ``sm90_tile`` (timed alone on the
#   H200, the Gluon tile runs at 0.51-0.94x the tl tile's time), so BLOCK_H 16 (4x the CTAs of 64, a quarter of the
#   partial rows per split) replaces the 32-row tile of 32 heads, and the Gluon tile in the smallest launches (1-4
#   tokens). BLOCK_K 32 at 16 heads: a 32-key tile costs ``small_key_tile`` of a 64-key one.


@dataclass(frozen=True)
class ConstantsChoice:
    """The constants the rule takes for one family on one device, and why: ``how`` is ``use_constants`` or ``env``
    (a user's file fitted for the device), ``device`` (the shipped file fitted for it) or ``fallback`` (none fitted
    for it: ``FALLBACK_DEVICE``'s)."""

    constants: CostConstants
    source: FittedConstants
    planned_for: str
    how: str

    @property
    def text(self) -> str:
        """One phrase for a plan's note and ``splitlab plan``: which constants, and why those."""
        if self.how == "fallback":
            return f"no constants fitted for {self.planned_for}; the fallback {self.source.label}"
        return (f"{ENV_CONSTANTS}=" if self.how == "env" else "") + self.source.label


#: Files given with ``use_constants``, by the device each was fitted for.
_given: dict[str, FittedConstants] = {}


def _device_name(name: str) -> str:
    """A preset's canonical name (``h200`` -> ``h200-sxm``); another name as it is."""
    from splitlab.devices import get as get_device

    try:
        return get_device(name).name
    except SplitlabError:
        return name


def _read(path: str | Path, arg: str) -> FittedConstants:
    fc = fitted.load(path, arg)
    return fc if _device_name(fc.device) == fc.device else replace(fc, device=_device_name(fc.device))


def use_constants(path: str | Path | None, *, arg: str = "use_constants") -> FittedConstants | None:
    """Make the ``splitlab`` planner (and so the launchers' ``num_splits=None``) take the constants of the file at
    ``path`` (``splitlab fit --out``) for the device the file was fitted for (its ``device``), in place of that
    device's shipped ones and of ``SPLITLAB_CONSTANTS``; other devices keep theirs. Several calls give several
    devices their files; None forgets them all. Returns the file read (a bad one is one ``SplitlabError`` naming
    it)."""
    if path is None:
        _given.clear()
        return None
    fc = _read(path, arg)
    _given[fc.device] = fc
    return fc


@contextlib.contextmanager
def using_constants(path: str | Path | None, *, arg: str = "use_constants") -> Iterator[FittedConstants | None]:
    """``use_constants(path)`` for the block, then back to the files in force before (None: nothing changes)."""
    saved = dict(_given)
    try:
        yield use_constants(path, arg=arg) if path is not None else None
    finally:
        _given.clear()
        _given.update(saved)


def env_constants() -> dict[str, FittedConstants]:
    """The files ``SPLITLAB_CONSTANTS`` names (one, or several separated by ``os.pathsep``), by device; a bad one
    is one ``SplitlabError`` naming the variable."""
    out = {}
    for path in filter(None, (p.strip() for p in os.environ.get(ENV_CONSTANTS, "").split(os.pathsep))):
        fc = _read(path, ENV_CONSTANTS)
        out[fc.device] = fc
    return out


def constants_for(dev: DeviceSpec | str, kind: str) -> ConstantsChoice:
    """The constants the ``splitlab`` planner takes for family ``kind`` on ``dev`` (a ``DeviceSpec`` or preset
    name): a file fitted for that device given with ``use_constants``, else one named by ``SPLITLAB_CONSTANTS``,
    else the shipped file fitted for it, else the fallback (``FALLBACK_DEVICE``'s). A file that lacks the family
    gives way to the next."""
    name = _device_name(dev) if isinstance(dev, str) else dev.name
    shipped = _shipped()
    for how, fc in (("use_constants", _given.get(name)), ("env", env_constants().get(name)),
                    ("device", shipped.get(name)), ("fallback", shipped.get(FALLBACK_DEVICE))):
        if fc is not None and kind in fc.families:
            return ConstantsChoice(fc.families[kind], fc, name, how)
    fallback = fitted.SHIPPED_DIR / f"{FALLBACK_DEVICE}.toml"
    raise SplitlabError(f"no {kind} constants for {name} and none in the fallback {fallback}; expected the shipped "
                        "file (reinstall splitlab) or a constants file (use_constants, SPLITLAB_CONSTANTS)")


@cache
def _shipped() -> dict[str, FittedConstants]:
    return fitted.shipped()


_warned: set[tuple[str, str]] = set()


def warn_if_fallback(kind: str, dev: DeviceSpec | str) -> None:
    """Warn once per process and (device, family) when the rule plans ``kind`` on ``dev`` with the fallback
    constants (what a launcher with ``num_splits=None`` calls)."""
    choice = constants_for(dev, kind)
    if choice.how == "fallback" and (choice.planned_for, kind) not in _warned:
        _warned.add((choice.planned_for, kind))
        warnings.warn(f"splitlab planner: {choice.text} plans {kind} here (fit constants for this GPU with "
                      f"`splitlab fit`, then {ENV_CONSTANTS}=FILE or splitlab.planners.splitlab.use_constants(FILE))",
                      stacklevel=3)


def fitted_cost(w: DecodeWorkload, num_splits, sm_count: int, c: CostConstants, block_h: int | None = None,
                arch: str = "", block_k: int | None = None):
    """``T(s)`` of the fitted rule for ``w`` (at head tile ``block_h`` and sparse MLA key tile ``block_k``; None: the
    kernel's defaults) on a device of ``sm_count`` SMs and architecture ``arch`` (where the Gluon tile runs: its
    rate and bf16 partials).
    ``num_splits`` may be an int or a numpy integer array, and the constants numpy arrays (``splitlab.fit``
    evaluates many settings at once); plain Python otherwise. A ragged batch (``w.lengths`` not all equal, dense
    families) is priced by ``ragged_launch_time``, one setting of plain constants at a time."""
    c0 = waves.ctas(w, 1, block_h=block_h)
    rows = tile_rows(w, block_h)
    wide = wide_tile(w, rows)
    mid = mid_tile(w, rows) * (c.ctas_per_sm_mid > 0)  # (0: the narrow width; plain stays plain)
    per_sm = c.ctas_per_sm if wide else mid * c.ctas_per_sm_mid + (1 - mid) * c.ctas_per_sm_narrow
    slots = sm_count * per_sm
    # LONE and DRAIN are fitted in waves of the narrow tile: LONE x CTAS_PER_SM_NARROW CTAs on an SM keep its share
    # of the bandwidth busy (1.8 on the H200), whatever their rows (each streams the same K/V tiles). A mid tile's
    # floor is that count over its own slots (0.9 at two to an SM), at most one wave.
    scale = mid * c.ctas_per_sm_narrow / (mid * c.ctas_per_sm_mid + (1 - mid)) + (1 - mid)
    lone_w = c.lone * scale
    lone_w = lone_w + (lone_w > 1) * (1 - lone_w)  # min(1, ...) (plain stays plain)
    rate = _tile_rate(w, rows, arch, block_k, c)
    key_tile = SMALL_TILE_KEYS if block_k is not None and block_k < TILE_KEYS else TILE_KEYS
    p = partial_tiles(w, block_h, arch, block_k)
    split = num_splits > 1
    busiest = -(-(c0 * num_splits) // sm_count)  # CTAs on the busiest SM: each writes its split's partial rows
    merge = split * (c.combine + c.combine_per_split * num_splits * c0 * p / sm_count)
    writes = split * c.partial * p * busiest + merge
    # A ragged batch: its CTAs differ, so price the launch's schedule (below). Not sparse MLA's: its kernel walks
    # every top-k slot of a token (an invalid one a masked index), so a token's CTAs last as its slots do.
    if w.kind != "sparse_mla" and len(set(w.lengths)) > 1:
        # a narrow CTA left alone streams up to 1 / CAP times faster (its SM's other CTAs done); a wide one, alone
        # on its SM already, does not speed up
        cap = 1.0 if wide else min(1.0, c.drain * scale) if c.drain >= 0 else lone_w if c.lone >= 0 else 1.0
        tiles = [cdiv(cdiv(n, num_splits), key_tile) for n in w.lengths]
        return ragged_launch_time(tiles, c0 // w.batch, num_splits, slots, rate, c.fixed, cap,
                                  request_major=REQUEST_MAJOR[w.kind]) + writes
    tiles = cdiv(cdiv(w.keys_per_request, num_splits), key_tile) * rate  # ceil(ceil(L / s) / KEYS) key tiles
    full, rem = (c0 * num_splits) // slots, (c0 * num_splits) % slots
    n_waves = full + (rem > 0) * (c.tail + (1 - c.tail) * rem / slots)  # tail 1: ceil(c0 * s / slots)
    n_waves = n_waves + (n_waves < 1) * (1 - n_waves)  # at least one wave (no np.maximum: plain stays plain)
    # Narrow tiles, LONE >= 0: an SM holds several narrow CTAs (GQA's 16-row tile: 3, by its 72 KiB of shared
    # memory), so a launch of less than one wave spreads its CTAs over all SMs and they share the bandwidth: it
    # costs its filled fraction of a wave, but no less than LONE (below it too few CTAs per SM are resident to keep
    # HBM busy, so each streams at its latency-bound rate). A wide tile (one CTA per SM) keeps the ceil / tail form.
    fill = rem / slots
    lone = (lone_w > fill) * lone_w + (lone_w <= fill) * fill  # max(LONE, fill) (plain stays plain)
    # ... and no less than its busiest SM takes (narrow tiles, DRAIN fitted): an SM streams at most 1 / DRAIN times
    # its share of a full wave, so the ceil(c0 * s / SMs) CTAs on it need DRAIN x busiest / CTAS_PER_SM_NARROW of a
    # wave. On the H200 (GQA 48/8, 9 requests, 80K keys) 4 splits put three 16-row CTAs on 24 SMs and two on the
    # rest: 771 us, against 704 at 5 splits (three on 96 SMs) and 697 at 3 (two on every SM); the three-CTA SMs
    # stream 41 GB/s, 1.2x their 34 GB/s share of the best launch (11 splits, 681 us). Not the mid tiles (two to an
    # SM): their cap is unmeasured.
    busy = (c.drain >= 0) * (1 - mid) * c.drain * busiest / per_sm
    lone = (busy > lone) * busy + (busy <= lone) * lone  # max (plain stays plain)
    n_waves = n_waves + (not wide) * (c.lone >= 0) * (full == 0) * (lone - n_waves)
    return n_waves * (tiles + c.fixed) + writes


def _tile_rate(w: DecodeWorkload, rows: int, arch: str, block_k: int | None, c: CostConstants):
    """What one key tile of the launch costs, in 64-key tiles of the tl kernel: SMALL_KEY_TILE for sparse MLA's
    32-key tile, NARROW for its 16-row tile in place of a wider default, TILE32 for MLA's 32-row tile (in 16-row
    tiles), SM90_TILE where the Gluon tile runs, 1 otherwise; a rate of 0 (never weighed) prices the tile out
    (1e30), and so does MLA's TILE32 0 a head tile other than the default."""
    rate = 1.0
    if block_k is not None and block_k < TILE_KEYS:  # a 32-key tile costs SMALL_KEY_TILE of a 64-key one
        rate = rate * c.small_key_tile + (c.small_key_tile <= 0) * 1e30
    if w.kind == "sparse_mla" and rows <= 16 and rows < tile_rows(w):  # a narrower tile than the default
        # a 16-row tile (4 warps) streams a key tile in NARROW of a 32/64-row tl tile's time
        rate = rate * c.narrow_tile + (c.narrow_tile <= 0) * 1e30
    if w.kind == "mla":  # MLA's tl 32-row tile streams a key tile in TILE32 of its 16-row tile's time; TILE32 0
        # (the head-tile rates not fitted): the same, and a head tile other than the default is never taken
        rate = rate * (c.tile32 + (c.tile32 <= 0)) if rows == 32 else rate
        rate = rate + (rows != tile_rows(w)) * (c.tile32 <= 0) * 1e30
    if sm90_tile_runs(w, rows, arch, block_k):
        rate = rate * c.sm90_tile  # the Gluon tile streams a key tile in SM90_TILE of the tl kernel's time
    return rate


#: The order in which each family's partial kernel issues its CTAs (its grid's fastest index last): GQA split-major
#: (grid (request x kv head, split): every request's CTAs of split 0 first), MLA and sparse MLA request-major (one
#: axis, head tile fastest, then split, then request: all of a request's splits together). Restated from the kernels
#: (``kernels.gqa``, ``kernels.mla``, ``kernels.mla_sm90``, ``kernels.sparse_mla``: ``GRID_ORDER``) for the
#: planner, which imports no torch; ``tests/test_ragged.py`` holds them equal.
REQUEST_MAJOR = {"gqa": False, "mla": True, "sparse_mla": True}


#: A ragged launch of this many waves of CTAs or more is priced in closed form (``ragged_launch_time``).
SCHEDULE_WAVES = 8


def ragged_launch_time(tiles: list[int], ctas_per_request: int, num_splits: int, slots: int, rate: float,
                       fixed: float, cap: float, *, request_major: bool = False) -> float:
    """The time of one partial launch whose CTAs differ in length, in key tiles of one CTA: a schedule of the
    launch on ``slots`` CTA slots (SMs x CTAs per SM), as the GPU runs it.

    Request i's ``ctas_per_request`` CTAs (kv heads, or head tiles) of each split stream ``tiles[i]`` key tiles
    (its own keys cut in ``num_splits``) at ``rate`` each after ``fixed`` of start-up: d_i = tiles[i] * RATE +
    FIXED. They are issued in the kernel's grid order (``request_major``: all of a request's CTAs together, as
    MLA and sparse MLA issue them; else split-major, GQA's: every request's CTAs of split 0, then of split 1),
    each into the first slot that frees. The resident CTAs share the bandwidth: each streams at
    ``min(1 / cap, slots / resident)`` (one tile per unit of time with every slot busy, up to 1 / CAP times
    faster as the launch drains and the other CTAs of its SM are done: ``fitted_cost`` passes DRAIN, else LONE,
    for a narrow tile and 1 for a wide one, alone on its SM already). The launch ends with its last CTA. CTAs of
    one length issued together are one event, and a launch of ``SCHEDULE_WAVES`` waves or more is priced in
    closed form (``_closed_form``, from the tiles' count, sum and longest alone), so a plan costs milliseconds at
    any batch."""
    if any(getattr(v, "ndim", 0) for v in (cap, fixed, rate)):  # numpy arrays: splitlab.fit's settings at once
        raise SplitlabError("ragged_launch_time prices one setting of the constants at a time (splitlab.fit "
                            "scores ragged batches setting by setting)")
    if ctas_per_request * num_splits * len(tiles) >= SCHEDULE_WAVES * slots:
        return _closed_form(len(tiles), sum(tiles), max(tiles), ctas_per_request, num_splits, slots, rate, fixed,
                            cap)
    durations = tuple(t * rate + fixed for t in tiles)
    return _schedule(durations, ctas_per_request, num_splits, slots, cap, request_major)


def _closed_form(ctas: int, total_tiles: float, longest_tiles: float, ctas_per_request: int, num_splits: int,
                 slots: int, rate: float, fixed: float, cap: float) -> float:
    """``ragged_launch_time`` of a launch of ``SCHEDULE_WAVES`` waves or more, whose ``ctas`` CTAs (per head group
    and split) stream ``total_tiles`` key tiles together, the longest ``longest_tiles``. Many waves: the order no
    longer shows. The work spread over the slots, and the last CTAs' drain (half a mean CTA at the drain speed), but
    never less than the longest CTA alone (within 5% of the schedule on every ragged fit batch of 8 waves or more;
    the schedule's cost grows with the batch, this does not).

    The durations' sum is ``total_tiles x RATE + ctas x FIXED`` and their longest ``longest_tiles x RATE + FIXED``
    (the duration grows with the tiles), from the tiles' total, not a sum of the durations one by one: integer tiles
    total exactly, so the schedule kernel on the device (``kernels.device_schedule``) prices a launch to the same bit
    from an integer reduction of its requests' tiles."""
    total = total_tiles * rate + ctas * fixed
    work = total * ctas_per_request * num_splits / slots
    return max(work + cap * total / ctas / 2, cap * (longest_tiles * rate + fixed))


def ragged_launch_floor(ctas: int, total_tiles: float, longest_tiles: float, ctas_per_request: int, num_splits: int,
                        slots: int, rate: float, fixed: float, cap: float) -> float:
    """A floor under ``ragged_launch_time`` for a launch of ``ctas`` CTAs (per head group and split) whose key tiles
    sum to ``total_tiles``, the longest ``longest_tiles``, from those three numbers alone: the closed form where that
    prices the launch (the price itself), else the larger of the work spread over every slot (the resident CTAs
    never stream more than ``slots`` tiles a unit of time together) and the longest CTA at its fastest (``1 / cap``
    tiles a unit). A scheduler skips pricing a candidate whose floor is above its best price so far
    (``schedulers.splitlab``)."""
    if ctas_per_request * num_splits * ctas >= SCHEDULE_WAVES * slots:
        return _closed_form(ctas, total_tiles, longest_tiles, ctas_per_request, num_splits, slots, rate, fixed, cap)
    work = (total_tiles * rate + ctas * fixed) * ctas_per_request * num_splits / slots
    longest = longest_tiles * rate + fixed
    return max(work, cap * longest) if cap > 0 else work


@lru_cache(maxsize=1 << 16)
def _schedule(durations: tuple[float, ...], ctas_per_request: int, num_splits: int, slots: int, cap: float,
              request_major: bool) -> float:
    """``ragged_launch_time``'s schedule of a launch of fewer than ``SCHEDULE_WAVES`` waves, remembered: the fit
    prices the same launch under every setting of the constants it does not depend on (the partial write's; a wide
    tile's drain), and a plan asked twice costs it once."""
    queue = ([(d, ctas_per_request * num_splits) for d in durations] if request_major else
             [(d, ctas_per_request) for _ in range(num_splits) for d in durations])
    pending = []  # heap of (the virtual work at which a group of CTAs ends, its CTAs)
    done = 0.0  # virtual work: what each resident CTA has streamed since the launch began, in key tiles
    now, resident, head, left = 0.0, 0, 0, queue[0][1]

    def issue(n: int) -> None:
        nonlocal resident, head, left
        while n > 0 and head < len(queue):
            k = min(n, left)
            heapq.heappush(pending, (done + queue[head][0], k))
            resident, n, left = resident + k, n - k, left - k
            if left == 0:
                head += 1
                left = queue[head][1] if head < len(queue) else 0

    issue(slots)
    while pending:
        end, n = heapq.heappop(pending)
        while pending and pending[0][0] == end:
            n += heapq.heappop(pending)[1]
        speed = min(1 / cap, slots / resident) if cap > 0 else slots / resident
        now += (end - done) / speed
        done, resident = end, resident - n
        issue(n)
    return now


def wide_tile(w: DecodeWorkload, rows: int) -> bool:
    """Whether a tile of ``rows`` query-head rows takes the wide tile's wave width (``ctas_per_sm``), else the
    narrow one's (``ctas_per_sm_narrow``): 64 rows or more, and sparse MLA's 32-row tile.

    Sparse MLA's 32-row tile is the 64-row tile's program with half the rows: the same 8 warps
    (``kernels.sparse_mla.SPARSE_MLA_TILES``) and nearly its shared memory (180 KB against 216 KB at BLOCK_K 64,
    2 stages, 576/512: both one CTA per SM), whose footprint is the gathered latent tiles, not the rows; it is
    the 16-row tile (4 warps) that the fit found to run two to an SM. Counted as narrow, 32 heads' default tile
    would be modelled with twice the slots it has, so the rule would split it to fill a wave that is already full
    and keep it against the 16-row tile, which is faster at equal splits on 217 of the 221 (32-head shape, split)
    pairs swept at both (median 0.92x the 32-row time, down to 0.67x; the 4 others within 6%, at 16-64 splits of
    2-8 tokens). MLA keeps its 32-row tile narrow (2 CTAs per SM fitted on MLA-32).

    GQA's tile is wide where the kernel gives it 8 warps (rows x padded head dim >= ``GQA_WIDE_ELEMENTS``: MQA-128's
    128 rows at D 128); its 4-warp 32- and 64-row tiles are ``mid_tile``s."""
    if w.kind == "gqa":
        return rows * next_power_of_two(w.head_dim_v) >= GQA_WIDE_ELEMENTS
    return rows >= 64 or (w.kind == "sparse_mla" and rows >= 32)


#: GQA's kernel runs a tile of rows x padded head dim of at least this many elements with 8 warps (``kernels.gqa``'s
#: launch facts; ``tests/test_ragged.py`` holds the two equal): the wide tile.
GQA_WIDE_ELEMENTS = 128 * 128


def mid_tile(w: DecodeWorkload, rows: int) -> bool:
    """Whether a tile takes the mid wave width (``ctas_per_sm_mid``, where fitted): GQA's 4-warp tiles of 32 or 64
    rows (groups 17-64 at D 128). Measured on the H200 (the GQA card's ``groups`` grid), they run two to an SM: at
    128 heads, 16 requests, 8K keys the best split fills 264 slots (group 32: 4 splits, 256 CTAs; 6 splits, 384, run
    1.29x slower; group 64: 8 splits, 256 CTAs), where the 16-row tile runs three (72 KiB of shared memory each)
    and MQA-128's 8-warp tile one."""
    return w.kind == "gqa" and not wide_tile(w, rows) and rows >= 32


def tile_rows(w: DecodeWorkload, block_h: int | None = None) -> int:
    """Query-head rows of one program's tile: GQA's padded group, else ``block_h`` (default: the kernel's)."""
    if w.kind == "gqa":
        return max(16, 1 << (w.group - 1).bit_length())
    return waves.default_block_h(w.num_q_heads) if block_h is None else block_h


def partial_tiles(w: DecodeWorkload, block_h: int | None = None, arch: str = "", block_k: int | None = None) -> float:
    """P: the bytes one split writes (the real query rows of its tile, Dv values of ``partial_bytes`` and an fp32
    lse each) over the bytes of one key tile it reads (TILE_KEYS keys: K and V rows for GQA, one latent row for
    MLA)."""
    tile = tile_rows(w, block_h)
    rows = w.group if w.kind == "gqa" else min(w.num_q_heads, tile)
    return rows * (w.head_dim_v * partial_bytes(w, tile, arch, block_k) + 4) / (TILE_KEYS * w.key_bytes)


#: The Gluon tile's scope (``kernels.mla_sm90.in_scope``, restated in plain numbers for the planner, which imports
#: no torch; ``tests/test_mla_sm90_scope.py`` holds the two equal): a 16-bit cache, the 64-row head tile and
#: 64-key tile, these Dv and Dqk - Dv, on an sm_90 GPU.
SM90_TILE_ROWS, SM90_TILE_KEYS, SM90_HEAD_DIMS_V, SM90_HEAD_DIMS_R = 64, 64, (256, 512), (0, 64)


def sm90_tile_runs(w: DecodeWorkload, rows: int, arch: str, block_k: int | None = None) -> bool:
    """Whether a launch of ``rows``-row tiles (and, sparse MLA, ``block_k``-key tiles; None: the default, 64) for
    ``w`` on ``arch`` runs the Gluon tile (``kernels.mla_sm90``)."""
    return (w.kind in ("mla", "sparse_mla") and arch == "sm_90" and w.dtype in ("bf16", "fp16")
            and rows == SM90_TILE_ROWS and block_k in (None, SM90_TILE_KEYS) and w.head_dim_v in SM90_HEAD_DIMS_V
            and w.head_dim_qk - w.head_dim_v in SM90_HEAD_DIMS_R)


def partial_bytes(w: DecodeWorkload, rows: int, arch: str, block_k: int | None = None) -> int:
    """Bytes of one partial value a split launch of ``rows``-row tiles writes on ``arch``: 2 where it runs the
    Gluon tile, which writes its partials in the cache's 16-bit dtype (``kernels.mla_sm90.PARTIALS_16BIT``), else
    4 (fp32: the tl kernels, GQA's, other GPUs)."""
    return 2 if sm90_tile_runs(w, rows, arch, block_k) else 4


def narrow_head_tiles(w: DecodeWorkload) -> tuple[int, ...]:
    """The head tiles narrower than the kernel's default that the sparse rule can weigh: BLOCK_H 16 for
    sparse MLA with a wider default and a 16-bit pool (the fit's data), else none. An fp8 pool keeps the
    default: its 64-row tile computes QK in fp8 while a 16-row tile widens the rows to 16 bits, 2.7x slower
    (H200, 128 heads 576/512, 32 tokens: 273 us against 101; the catalog's bench run ``h200-fp8``)."""
    if w.kind != "sparse_mla" or w.dtype == "fp8_e4m3":
        return ()
    return (16,) if waves.default_block_h(w.num_q_heads) > 16 else ()


def _weighed(rate) -> bool:
    """Whether a tile's cost constant (a number, or ``splitlab.fit``'s array over settings) puts it on the table:
    > 0 for any setting."""
    return getattr(rate, "max", lambda: rate)() > 0


def head_tiles(w: DecodeWorkload, c: CostConstants, arch: str = "") -> tuple[int | None, ...]:
    """The head tiles the rule weighs: the kernel's default (None) and, sparse MLA, where the 16-row tile has a
    cost (``narrow_tile > 0``), the ``narrow_head_tiles``; MLA, where the head-tile rates were fitted
    (``tile32 > 0``) and the default is the tl 32-row tile (17-32 heads), the Gluon 64-row tile on ``arch``
    where it runs. Measured on the H200 (the MLA card's ``tiles`` grid: 8-128 heads, batch 1-64, every split at
    BLOCK_H 16, 32 and 64), the best head tile was the 16-row one at 8-16 heads (the 64-row tile ties it at
    batch 4-16 and is 1.03-1.11x slower at batch 1 and 64; 32 rows 1.15-1.38x slower) and the 64-row tile from 24
    heads up (1.07-1.36x faster than the default 32 rows at 24-32 heads); a narrower tile than the default reads
    the latent cache once more per extra head tile and was never faster. So the one choice the rule makes is
    the 64-row tile against the 32-row default, by TILE32 (the 32-row tile's key-tile cost) against SM90_TILE."""
    if w.kind == "mla":
        default = waves.default_block_h(w.num_q_heads)
        gluon = default == 32 and sm90_tile_runs(w, SM90_TILE_ROWS, arch)
        return (None, SM90_TILE_ROWS) if gluon and _weighed(c.tile32) else (None,)
    return (None, *narrow_head_tiles(w)) if _weighed(c.narrow_tile) else (None,)


def split_candidates(w: DecodeWorkload, max_splits: int, sm_count: int | None = None,
                     block_h: int | None = None, block_k: int | None = None) -> list[int]:
    """Powers of two, and with ``sm_count`` the wave-filling split counts (``waves.wave_fill_splits``, at head
    tile ``block_h``), from 1 up to the limit ``min(max_splits, ceil(L / MIN_KEYS_PER_SPLIT))``, and the limit
    itself (one key tile a split: 6 splits of top-k 384, where the powers of two stop at 4, two tiles a split),
    ascending. A sparse key tile ``block_k`` narrower than 64 keys moves the limit to one such tile a split."""
    min_keys = MIN_KEYS_PER_SPLIT[w.kind] if block_k is None else min(block_k, MIN_KEYS_PER_SPLIT[w.kind])
    limit = max(1, min(max_splits, cdiv(w.keys_per_request, min_keys)))
    out, s = {limit}, 1
    while s <= limit:
        out.add(s)
        s *= 2
    if sm_count is not None:
        out.update(waves.wave_fill_splits(w, sm_count, limit, block_h=block_h))
    return sorted(out)


def key_tiles(w: DecodeWorkload, c: CostConstants, block_h: int | None = None) -> tuple[int | None, ...]:
    """The key tiles (BLOCK_K) the rule weighs at head tile ``block_h``: sparse MLA with rows up to 512 wide takes
    64 keys and, where a 32-key tile has a cost (``small_key_tile > 0``) and the head tile is the 16-row one by
    default (16 heads or fewer), 32; wider rows and the dense kernels keep the kernel's default (None).

    Only there: the data time BLOCK_K 32 against 64 at every split of few tokens for 16 heads alone (the other
    head counts have it at the tl 64-row tile, which never gains from it, and at the 16-row tile on one split
    count), so a rule weighing it elsewhere would pick knobs that nobody timed."""
    if w.kind != "sparse_mla" or w.head_dim_qk > 512:
        return (None,)
    small = _weighed(c.small_key_tile) and block_h is None and tile_rows(w) <= 16
    return (TILE_KEYS, SMALL_TILE_KEYS) if small else (TILE_KEYS,)


def candidates(w: DecodeWorkload, c: CostConstants, sm_count: int,
               arch: str = "") -> list[tuple[int | None, int | None, int]]:
    """Every (head tile, key tile, split count) the rule weighs, in its tie order: the default head tile first,
    then the 64-key tile, then fewer splits."""
    return [(bh, bk, s) for bh in head_tiles(w, c, arch) for bk in key_tiles(w, c, bh)
            for s in split_candidates(w, c.max_splits, sm_count, bh, bk)]


def fitted_plan(w: DecodeWorkload, dev: DeviceSpec, constants: CostConstants | None = None,
                name: str = "splitlab") -> Plan:
    """The fitted rule's plan for ``w`` on ``dev`` (``constants``: a family's ``CostConstants``, default
    ``constants_for(dev, w.kind)``'s, which the note then names): the (head tile, key tile, split count) of least
    ``fitted_cost``; ties go to the default
    head tile, then to 64 keys, then to fewer splits."""
    choice = constants_for(dev, w.kind) if constants is None else None
    c = choice.constants if choice is not None else constants
    best, best_cost = (None, None, 1), None
    for bh, bk, s in candidates(w, c, dev.sm_count, dev.arch):
        cost = fitted_cost(w, s, dev.sm_count, c, bh, dev.arch, bk)
        if best_cost is None or cost < best_cost:
            best, best_cost = (bh, bk, s), cost
    bh, bk, s = best
    note = "fitted wave-cost model" + (f", BLOCK_H {bh}" if bh is not None else "") + (
        f", BLOCK_K {bk}" if bk is not None and bk != TILE_KEYS else "") + (
        f"; constants: {choice.text}" if choice is not None else "")
    return Plan(name, s, block_k=bk, block_h=bh, note=note)


@register("splitlab", kinds=KINDS,  # every family: the tables above cover each kind (tests/test_families.py)
          source="splitlab (this repository), constants fitted per device (splitlab/planners/constants)")
def plan_splitlab(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """splitlab's wave-cost rule with the constants fitted for ``dev`` (``constants_for``)."""
    return fitted_plan(w, dev)
