"""The wave model: how many CTAs a split-K launch makes, and how they fill a device.

A launch of ``ctas`` CTAs on ``sm_count`` SMs that each hold ``ctas_per_sm`` of them at once runs in
``ceil(ctas / slots)`` waves (``slots = sm_count * ctas_per_sm``). The last wave is ``last_wave_fill``
full; ``efficiency = waves / ceil(waves)`` is the fraction of the issued wave slots that do work (the
quantity FlashAttention's split heuristic maximises).
"""

from __future__ import annotations

from dataclasses import dataclass

from splitlab.errors import SplitlabError, check_int
from splitlab.intmath import cdiv, next_power_of_two
from splitlab.workloads import DecodeWorkload

MAX_BLOCK_H = 64  # the MLA kernels pack at most this many query heads per program


def default_block_h(num_q_heads: int) -> int:
    """Query heads packed per MLA / sparse-MLA program: the head count rounded up to a power of two,
    at least 16 (the smallest ``tl.dot`` M) and at most 64."""
    return min(max(16, next_power_of_two(num_q_heads)), MAX_BLOCK_H)


def ctas(w: DecodeWorkload, num_splits: int, *, block_h: int | None = None) -> int:
    """CTAs of one split-K partial launch of splitlab's kernel for ``w``.

    gqa:         one program per (request, kv head, split); all query heads of the group in its tile.
    mla:         one program per (request, head tile of ``block_h``, split).
    sparse_mla:  one program per (query token, head tile of ``block_h``, split).
    """
    num_splits = check_int("num_splits", num_splits)
    if w.kind == "gqa":
        return w.batch * w.num_kv_heads * num_splits
    bh = default_block_h(w.num_q_heads) if block_h is None else check_int("block_h", block_h)
    return w.batch * cdiv(w.num_q_heads, bh) * num_splits


@dataclass(frozen=True)
class WaveStats:
    """How ``ctas`` CTAs fill ``sm_count * ctas_per_sm`` slots."""

    ctas: int
    sm_count: int
    ctas_per_sm: int = 1

    def __post_init__(self) -> None:
        check_int("ctas", self.ctas)
        check_int("sm_count", self.sm_count)
        check_int("ctas_per_sm", self.ctas_per_sm)

    @property
    def slots(self) -> int:
        """CTAs resident at once on the whole device."""
        return self.sm_count * self.ctas_per_sm

    @property
    def waves(self) -> float:
        """Fractional waves, ``ctas / slots``."""
        return self.ctas / self.slots

    @property
    def num_waves(self) -> int:
        """Waves issued, ``ceil(ctas / slots)``."""
        return cdiv(self.ctas, self.slots)

    @property
    def last_wave_fill(self) -> float:
        """Fraction of the last wave's slots that hold a CTA (1.0 when the waves are whole)."""
        return (self.ctas - (self.num_waves - 1) * self.slots) / self.slots

    @property
    def efficiency(self) -> float:
        """``waves / ceil(waves)``: the share of issued slots that do work."""
        return self.waves / self.num_waves


def wave_stats(w: DecodeWorkload, num_splits: int, sm_count: int, *, block_h: int | None = None,
               ctas_per_sm: int = 1) -> WaveStats:
    """Wave statistics of splitlab's partial launch for ``w`` at ``num_splits`` on ``sm_count`` SMs."""
    if sm_count < 1:
        raise SplitlabError(f"sm_count={sm_count} is not allowed; expected an integer >= 1")
    return WaveStats(ctas(w, num_splits, block_h=block_h), sm_count, ctas_per_sm)


WAVE_FILL_WAVES = 8  # wave-filling split counts for 1..8 CTA slots per SM-wave


def wave_fill_splits(w: DecodeWorkload, sm_count: int, max_splits: int, *,
                     block_h: int | None = None) -> tuple[int, ...]:
    """Split counts (2..``max_splits``) whose launch fills whole waves: ``floor(m * sm_count / c0)`` for
    ``m = 1..WAVE_FILL_WAVES``, ``c0`` the CTAs of the unsplit launch (m counts SM slots: waves times CTAs per
    SM). They are rarely powers of two (3 requests of MLA-32, one 32-row head tile each, on 132 SMs: 44, 88,
    132, ...), and on the H200 they are often the fastest split: in the confirm set (catalog ``h200-confirm``) the
    best split is not a power of two on 32 of 40 MLA shapes, 21 of 40 sparse MLA and 4 of 18 GQA. ``block_h``:
    the head tile of MLA / sparse MLA (default: the kernels' default tile), which sets ``c0``."""
    c0 = ctas(w, 1, block_h=block_h)
    out = {m * sm_count // c0 for m in range(1, WAVE_FILL_WAVES + 1)}
    return tuple(sorted(x for x in out if 2 <= x <= max_splits))
