"""FlashAttention's split-KV heuristics: FA2 (``csrc/flash_attn/flash_api.cpp``), FA3 (``hopper/heuristics.h``
with its caller ``get_num_splits`` in ``hopper/flash_api.cpp``) and FA4 (``flash_attn/cute/interface.py``).

Repository ``Dao-AILab/flash-attention``; docs/planners.md section 4 cites commit
``0251105a2fb19d2957484b7f023cd8c115286ced`` (main). Every ported function was checked against that commit's
own text: ``hopper/tile_size.h``, ``hopper/heuristics.h``, ``hopper/flash_api.cpp`` (``get_pagedkv_tma``,
``get_pack_gqa``, ``get_num_splits``, ``round_up_headdim[v]``, ``mha_fwd``), ``hopper/flash_prepare_scheduler.cu``,
``csrc/flash_attn/flash_api.cpp`` and ``flash_attn/cute/interface.py``; older stored versions named on a function
agree with it there.

C++ float semantics. ``0.8f * num_SMs`` is a float32 product and ``n_waves``/``eff`` are float32; the
``0.85 * max_efficiency`` of the final pass is a *double* literal (not ``0.85f``) in both FA2 and FA3. The
ports reproduce this with ``numpy.float32`` (IEEE single, round to nearest, as nvcc/gcc host code), and
it matters:

* the 80 % gate cannot flip against exact arithmetic while ``0.8 * num_SMs < 2**21`` (``0.8f`` is
  0.8 * (1 + 1.5e-8), inside half an ulp), so there float32 and exact agree (tested);
* the 85 % pass *does* flip on exact ties, ``eff(s) == 0.85 * max_eff`` in rationals, which integer inputs hit
  often: FA2 ``num_splits_heuristic(11, 264, 100, 128)`` is 20 in float32 but 17 in exact or double
  arithmetic; FA3 ``num_splits_heuristic_fa3(1, 132, 100, 1, 0, False, 128)`` (an MQA/MLA decode of 100
  blocks on 132 SMs) is 86, not 85. A sweep of FA2 at 264 "SMs" (bnm < 212, n_blocks <= 128) finds 62 such
  inputs; of FA3 at 132 SMs (total_mblocks < 106, 5..256 blocks), 14.
"""

from __future__ import annotations

import numpy as np

from splitlab.devices import DeviceSpec
from splitlab.errors import check_int
from splitlab.intmath import cdiv
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

FA_REPO = "Dao-AILab/flash-attention"
FA2_SOURCE = f"{FA_REPO} csrc/flash_attn/flash_api.cpp @ 0251105a2fb19d2957484b7f023cd8c115286ced"
FA3_SOURCE = (f"{FA_REPO} hopper/heuristics.h + hopper/flash_api.cpp @ "
              "0251105a2fb19d2957484b7f023cd8c115286ced")
FA4_SOURCE = f"{FA_REPO} flash_attn/cute/interface.py @ 0251105a2fb19d2957484b7f023cd8c115286ced"

_f32 = np.float32
_SIZE_L2 = 50 * 1024 * 1024  # FA3: "we assume that L2 size is 50MB"
_PREPARE_VARLEN_MAX_BATCHES_1CTA = 992  # FA3 hopper/flash_api.cpp: the batch one prepare CTA plans (31 x 32)


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """FA2 ``num_splits_heuristic``: 1 if ``batch_nheads_mblocks >= 0.8f * num_SMs``; else, over
    ``s <= min(max_splits, num_SMs, num_n_blocks)``, the wave efficiency ``n_waves / ceil(n_waves)`` with
    ``n_waves = float(bnm * s) / num_SMs`` (float32), where only *eligible* ``s`` count (``s == 1`` or
    ``cdiv(n_blocks, s) != cdiv(n_blocks, s - 1)``; others get 0); return the first eligible ``s`` with
    ``eff >= 0.85 * max_eff`` (double), else 1. The caller passes ``num_SMs = 2 * multiProcessorCount``.

    Source: ``Dao-AILab/flash-attention`` ``csrc/flash_attn/flash_api.cpp`` @ ``0251105a`` (planners.md 4.1);
    text checked against the stored version @ ``00979f57acf503b0b080ff08ada0007080074649`` (index id
    47198130160).
    """
    batch_nheads_mblocks = check_int("batch_nheads_mblocks", batch_nheads_mblocks, minimum=0)
    num_sms = check_int("num_sms", num_sms)
    num_n_blocks = check_int("num_n_blocks", num_n_blocks, minimum=0)
    max_splits = check_int("max_splits", max_splits)

    # If we have enough to almost fill the SMs, then just use 1 split
    if _f32(batch_nheads_mblocks) >= _f32(0.8) * _f32(num_sms):
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    max_efficiency = _f32(0.0)
    efficiency: list[np.float32] = []

    def is_split_eligible(num_splits: int) -> bool:
        return num_splits == 1 or cdiv(num_n_blocks, num_splits) != cdiv(num_n_blocks, num_splits - 1)

    with np.errstate(invalid="ignore"):  # bnm == 0: 0.f / 0.f is NaN, never the max, never chosen (as in C++)
        for num_splits in range(1, max_splits + 1):
            if not is_split_eligible(num_splits):
                efficiency.append(_f32(0.0))
            else:
                n_waves = _f32(batch_nheads_mblocks * num_splits) / _f32(num_sms)
                eff = n_waves / np.ceil(n_waves)
                if eff > max_efficiency:
                    max_efficiency = eff
                efficiency.append(eff)
    for num_splits in range(1, max_splits + 1):
        if not is_split_eligible(num_splits):
            continue
        if float(efficiency[num_splits - 1]) >= 0.85 * float(max_efficiency):
            return num_splits
    return 1


def num_splits_heuristic_fa3(total_mblocks: int, num_sms: int, num_n_blocks: int, num_m_blocks: int,
                             size_one_kv_head: int, is_causal_or_local: bool, max_splits: int) -> int:
    """FA3 ``num_splits_heuristic``: if ``total_mblocks >= 0.8f * num_SMs``, split only when one KV head does
    not fit a 50 MiB L2 (``size_one_kv_head > 50 MiB``), there are ``num_m_blocks >= 2 * num_SMs`` query
    blocks and no causal/local mask: ``min(cdiv(size_one_kv_head, 50 MiB), max_splits)``, else 1. Otherwise 1
    if ``num_n_blocks <= 4``; else, over ``s <= min(max_splits, num_SMs, num_n_blocks)`` (no eligibility
    filter), the first ``s`` with float32 efficiency ``>= 0.85 * max_eff`` (double).

    Source: ``Dao-AILab/flash-attention`` ``hopper/heuristics.h`` @ ``0251105a`` (planners.md 4.2); text
    checked against the stored version @ ``13d0fd9cc276cb666afc88373e2d81449acdc749`` (index id 17172923029).
    Upstream computes ``size_one_kv_head + size_l2 - 1`` in ``int`` (wraps above ~1.95 GiB per head, where
    upstream would return a non-positive count); the port uses exact integers there.
    """
    total_mblocks = check_int("total_mblocks", total_mblocks, minimum=0)
    num_sms = check_int("num_sms", num_sms)
    num_n_blocks = check_int("num_n_blocks", num_n_blocks, minimum=0)
    num_m_blocks = check_int("num_m_blocks", num_m_blocks, minimum=0)
    size_one_kv_head = check_int("size_one_kv_head", size_one_kv_head, minimum=0)
    max_splits = check_int("max_splits", max_splits)

    if _f32(total_mblocks) >= _f32(0.8) * _f32(num_sms):
        size_l2 = _SIZE_L2
        # Only split if there are enough queries to go over the KV at least twice; don't split if causal
        if size_one_kv_head > size_l2 and num_m_blocks >= num_sms * 2 and not is_causal_or_local:
            return min((size_one_kv_head + size_l2 - 1) // size_l2, max_splits)
        return 1
    # If num_n_blocks is too small, use 1 split (e.g. hdim 128 and seqlen_k = 512 never splits)
    if num_n_blocks <= 4:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    max_efficiency = _f32(0.0)
    efficiency: list[np.float32] = []
    with np.errstate(invalid="ignore"):  # total_mblocks == 0: NaN efficiencies, as in C++; returns 1
        for num_splits in range(1, max_splits + 1):
            n_waves = _f32(total_mblocks * num_splits) / _f32(num_sms)
            eff = n_waves / np.ceil(n_waves)
            if eff > max_efficiency:
                max_efficiency = eff
            efficiency.append(eff)
    for num_splits in range(1, max_splits + 1):
        if float(efficiency[num_splits - 1]) >= 0.85 * float(max_efficiency):
            return num_splits
    return 1


def num_splits_heuristic_fa4(total_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """FA4 (CuTe DSL) ``num_splits_heuristic``: 1 if ``num_n_blocks <= 4`` or ``total_mblocks == 0``, else
    ``min(num_SMs // total_mblocks, max_splits, num_n_blocks)``.

    Returns **0** whenever ``total_mblocks > num_SMs`` (integer division), as upstream does; the caller treats
    ``num_splits > 1`` as split, so 0 runs unsplit. Source: ``Dao-AILab/flash-attention``
    ``flash_attn/cute/interface.py`` @ ``0251105a`` (planners.md 4.3). The stored version
    @ ``004b1a2e41bfc31df23ba37e064a7d1406c3bd1b`` (index id 53747497366) lacks the ``total_mblocks == 0``
    guard (it would divide by zero there); otherwise identical.
    """
    total_mblocks = check_int("total_mblocks", total_mblocks, minimum=0)
    num_sms = check_int("num_sms", num_sms)
    num_n_blocks = check_int("num_n_blocks", num_n_blocks, minimum=0)
    max_splits = check_int("max_splits", max_splits)
    if num_n_blocks <= 4:
        return 1
    if total_mblocks == 0:
        return 1
    return min(num_sms // total_mblocks, max_splits, num_n_blocks)


# --- FA3 tile sizes and head-dim rounding (hopper/tile_size.h, hopper/flash_api.cpp) ------------------------

def tile_size_fwd_sm90(headdim: int, headdim_v: int, is_causal: bool, is_local: bool, element_size: int = 2,
                       v_colmajor: bool = False, paged_kv_non_tma: bool = False,
                       softcap: bool = False) -> tuple[int, int, bool, bool]:
    """FA3 ``tile_size_fwd_sm90``: ``(kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap)`` for the (rounded) head
    dims. E.g. bf16 hdim 128: ``128 x 176``, or ``128 x 128`` when causal, local or paged without TMA; bf16 hdim
    64 (``headdim_v`` not 256 or 512): ``192 x 192``, or ``192 x 128`` when causal, local or paged without TMA.

    Source: ``Dao-AILab/flash-attention`` ``hopper/tile_size.h`` @ ``0251105a2fb19d2957484b7f023cd8c115286ced``
    (main), the commit this module cites. An earlier port followed ``07602adc2baa7a3ea037321ef2ca71c83096e5d5``
    (the head of pull request 2022, never merged), whose hdim <= 64 tiles differ: ``192 x 160`` paged without
    TMA or local (main: ``192 x 128``), ``128 x 112`` for ``headdim_v == 256`` (main: ``128 x 96``), other flags,
    and a ``use_one_mma_wg`` argument main does not have.
    """
    if element_size == 2:
        if headdim <= 64:
            if headdim_v == 512:
                return (64, 64, False, False)
            if headdim_v == 256:
                return (128, 96, True, False)
            use_block_n_128 = is_causal or is_local or paged_kv_non_tma
            return (192, 128 if use_block_n_128 else 192, use_block_n_128, True)
        if headdim <= 96:
            return (192, 128 if is_local or paged_kv_non_tma else 144, False, True)
        if headdim <= 128:
            use_block_n_128 = is_causal or is_local or paged_kv_non_tma
            return (128, 128 if use_block_n_128 else 176, True, True)
        if headdim <= 192:
            block_n = 96 if paged_kv_non_tma or is_local else (128 if headdim_v <= 128 else 112)
            return (128, block_n, True, True)
        return (128, 64 if is_local else 80, True, True)
    if headdim <= 64:
        return (192, 160, True, True)
    if headdim <= 96:
        return (192, 128, True, True)
    if headdim <= 128:
        block_n = 160 if paged_kv_non_tma else (192 if v_colmajor or (softcap and is_local) else 224)
        return (128, block_n, True, True)
    if headdim <= 192:
        return (128, 128 if (paged_kv_non_tma or softcap) and is_local else 160, True, True)
    return (128, 64 if is_local else 128, True, not paged_kv_non_tma)


def round_up_headdim(head_size: int) -> int:
    """FA3 ``round_up_headdim`` (all head dims compiled in): 64, 96, 128, 192, 256, and 256 above that."""
    for r in (64, 96, 128, 192, 256):
        if head_size <= r:
            return r
    return 256


def round_up_headdimv(head_size: int) -> int:
    """FA3 ``round_up_headdimv``: 64, 96, 128, 192, 256, else 512."""
    for r in (64, 96, 128, 192, 256):
        if head_size <= r:
            return r
    return 512


def prepare_varlen_num_splits(seqlens_q: list[int], seqlens_k: list[int], num_head: int, qhead_per_khead: int,
                              num_sm: int, num_splits_static: int, block_m: int, block_n: int) -> list[int]:
    """FA3 ``prepare_varlen_num_blocks_kernel``'s dynamic split per batch entry when the kernel runs as one CTA
    (varlen with ``b <= 992``; above that it sets every split to 1):
    ``total_blocks = sum(cdiv(sq * qhead_per_khead, block_m) * cdiv(sk, block_n))``,
    ``blocks_per_sm = int(ceilf(float(total_blocks) * 1.1f * float(num_head) / float(num_sm)))`` (float32),
    split ``i`` = ``max(min(cdiv(n_blocks_i, blocks_per_sm), num_splits_static), 1)``.

    Source: ``Dao-AILab/flash-attention`` ``hopper/flash_prepare_scheduler.cu`` @ ``0251105a`` (the same step
    as the stored ``000090d02f0398e9087a8823fc1f5242becfac99``, index id 47630566347). ``blocks_per_sm`` is 0
    only when every length is 0, where upstream divides by zero (its ``std::max(1, ...)`` is commented out);
    the port uses 1 there.
    """
    num_m = [cdiv(sq * qhead_per_khead, block_m) for sq in seqlens_q]
    num_n = [cdiv(sk, block_n) for sk in seqlens_k]
    total_blocks = sum(m * n for m, n in zip(num_m, num_n, strict=True))
    blocks_per_sm = int(np.ceil(_f32(total_blocks) * _f32(1.1) * _f32(num_head) / _f32(num_sm)))
    blocks_per_sm = max(blocks_per_sm, 1)
    return [max(min(cdiv(n, blocks_per_sm), num_splits_static), 1) for n in num_n]


# --- adapter ------------------------------------------------------------------------------------------------

def _elem_size(w: DecodeWorkload) -> int:
    return 1 if w.dtype == "fp8_e4m3" else 2


def _plan_fa2(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    # mha_fwd_kvcache: seqlen_q == 1 and num_heads > num_heads_k swaps the group into the sequence dimension.
    d, dv = w.head_dim_qk, w.head_dim_v
    swapped = w.num_q_heads > w.num_kv_heads and d % 8 == 0
    seqlen_q, num_heads = (w.group, w.num_kv_heads) if swapped else (1, w.num_q_heads)
    seqlen_k = cdiv(w.keys_per_request, w.page_size) * w.page_size  # block_table width * page_block_size
    max_head_size = max(d, dv)
    block_n = 256 if max_head_size <= 64 else (128 if max_head_size <= 128 else 64)
    num_n_blocks = cdiv(seqlen_k, block_n)
    num_m_blocks = cdiv(seqlen_q, 64)
    bnm = w.batch * num_heads * num_m_blocks
    num_splits = num_splits_heuristic(bnm, dev.sm_count * 2, num_n_blocks, 128)
    note = (f"FA2 set_params_splitkv: {'GQA swap, ' if swapped else ''}seqlen_q={seqlen_q}, "
            f"num_heads={num_heads}, batch_nheads_mblocks={bnm}, num_SMs=2*{dev.sm_count}, "
            f"block_n={block_n}, "
            f"num_n_blocks=cdiv({seqlen_k},{block_n})={num_n_blocks}, max_splits=128")
    if w.kind == "mla":
        note += (f"; MLA as MQA (Hkv=1, group={w.num_q_heads}, d={d}, dv={dv}): upstream FA2 has no {d} "
                 "head-dim path (head_size <= 256), block_n from its > 128 branch")
    if w.page_size % 256:
        note += f"; upstream FA2 paged KV needs page_block_size % 256 == 0 (page_size={w.page_size})"
    if dev.vendor == "amd":
        note += "; ROCm FlashAttention uses CK's own split logic (not ported): CUDA FA2 rule applied as-is"
    return Plan("flash_attn", num_splits, block_n=block_n, note=note,
                extra={"version": "FA2", "batch_nheads_mblocks": bnm, "num_n_blocks": num_n_blocks,
                       "num_sms": dev.sm_count * 2})


def _plan_fa3(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    b, h, h_k = w.batch, w.num_q_heads, w.num_kv_heads
    qv = w.kind == "mla" and 0 < w.head_dim_qk - w.head_dim_v <= 64
    # FA3's MLA decode is its q_v path: q/k = the RoPE part (<= 64), q_v/v = the latent (dv <= 512).
    d, dv = (w.head_dim_qk - w.head_dim_v, w.head_dim_v) if qv else (w.head_dim_qk, w.head_dim_v)
    elem = _elem_size(w)
    d_rounded = round_up_headdim(d)
    dv_rounded = d_rounded if dv == d else round_up_headdimv(dv)
    seqlen_q = 1
    page_size = w.page_size
    seqlen_k = cdiv(w.keys_per_request, page_size) * page_size  # max_num_pages_per_seq * page_size
    # mha_fwd: causal=True (as vLLM passes it) survives seqlen_q == 1 only for paged hdim in (64, 128].
    is_causal = 64 < d <= 128
    # get_pagedkv_tma
    tma_m, tma_n, _, _ = tile_size_fwd_sm90(d_rounded, dv_rounded, is_causal, False, elem, False, False,
                                            False)
    pagedkv_tma = page_size % tma_n == 0 and seqlen_q * (h // h_k) > tma_m
    # get_num_splits (is_varlen: cache_seqlens/seqused_k given, so num_splits_dynamic_ptr is set and the batch
    # counts as 1 whatever b is; the dynamic split itself runs only for b <= 992)
    kblock_m, kblock_n, _, _ = tile_size_fwd_sm90(d_rounded, dv_rounded, is_causal, False, elem, False,
                                                  not pagedkv_tma, False)
    one_cta_prepare = b <= _PREPARE_VARLEN_MAX_BATCHES_1CTA
    seqlen_q_packgqa = seqlen_q * (h // h_k)
    num_n_blocks = cdiv(seqlen_k, kblock_n)
    num_m_blocks = cdiv(seqlen_q_packgqa, kblock_m)
    size_one_kv_head = seqlen_k * (d + dv) * elem
    total_mblocks = h_k * num_m_blocks  # (num_splits_dynamic_ptr ? 1 : b) * h_k * num_m_blocks
    num_splits_static = num_splits_heuristic_fa3(total_mblocks, dev.sm_count, num_n_blocks, num_m_blocks,
                                                 size_one_kv_head, is_causal, 128)
    # get_pack_gqa: always for paged non-TMA or split; else should_pack_gqa(varlen_q=True) unless h == h_k
    pack_gqa = (not pagedkv_tma) or num_splits_static > 1 or h != h_k
    extra = {"version": "FA3", "kBlockM": kblock_m, "kBlockN": kblock_n, "total_mblocks": total_mblocks,
             "num_n_blocks": num_n_blocks, "num_splits_static": num_splits_static, "pagedkv_tma": pagedkv_tma,
             "pack_gqa": pack_gqa}
    note = (f"FA3 get_num_splits: d={d}, dv={dv} (rounded {d_rounded}/{dv_rounded}), "
            f"{'causal, ' if is_causal else ''}paged {'TMA' if pagedkv_tma else 'non-TMA'} -> "
            f"kBlockM={kblock_m}, kBlockN={kblock_n}; seqlen_q_packgqa={seqlen_q_packgqa}, "
            f"total_mblocks={total_mblocks}")
    per_request = None
    if one_cta_prepare:
        per = prepare_varlen_num_splits([seqlen_q] * b, list(w.lengths), h_k if pack_gqa else h,
                                        cdiv(h, h_k) if pack_gqa else 1, dev.sm_count, num_splits_static,
                                        kblock_m, kblock_n)
        per_request = tuple(per)
        num_splits = max(per)
        note += (f" (varlen: batch counted as 1, static bound {num_splits_static}); per-request split from "
                 "prepare_varlen_num_blocks")
    else:
        # prepare_varlen_num_blocks_kernel with gridDim.x > 1 sets num_splits_dynamic = 1 for every batch entry.
        num_splits = 1
        note += (f" (varlen with b > {_PREPARE_VARLEN_MAX_BATCHES_1CTA}: the batch counted as 1, static bound "
                 f"{num_splits_static}; the prepare kernel runs as several CTAs and sets every request's split to 1)")
    if w.kind == "mla" and qv:
        note += (f"; MLA as MQA (Hkv=1, group={h}) through FA3's q_v path: q/k = the {d} RoPE dims, "
                 f"q_v/v = the {dv}-dim latent (upstream FA has no {w.head_dim_qk} head-dim path: at most "
                 "256)")
    elif w.kind == "mla":
        note += (f"; MLA as MQA (Hkv=1, group={h}, d={d}, dv={dv}): upstream FA has no such head-dim path; "
                 "tiles as tile_size_fwd_sm90 gives them for the rounded dims")
    return Plan("flash_attn", num_splits, block_n=kblock_n, per_request=per_request, note=note, extra=extra)


@register("flash_attn", kinds=("gqa", "mla"), source=f"{FA3_SOURCE}; {FA2_SOURCE}")
def plan_flash_attn(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """FlashAttention's split choice for a paged decode: FA3 on sm_90 devices, FA2 everywhere else.

    FA2 (``mha_fwd_kvcache``): GQA packing swaps the group into the sequence dimension
    (``seqlen_q = H/Hkv``, ``num_heads = Hkv``), ``block_n`` 256/128/64 by head size, ``num_m_blocks =
    cdiv(seqlen_q, 64)``, ``num_SMs = 2 * sm_count``, ``max_splits = 128``.

    FA3 (``mha_fwd`` -> ``get_num_splits``): assumes the vLLM-style call (paged KV, ``cache_seqlens``,
    ``cu_seqlens_q``, ``causal=True``, bf16/fp16): tiles from ``tile_size_fwd_sm90`` (hdim 128 bf16 paged
    non-TMA: 128 x 128; hdim 64 paged non-TMA: 192 x 128),
    ``seqlen_q_packgqa = group``, ``num_SMs = sm_count`` (``sm_margin = 0``), ``max_splits = 128``; varlen
    counts the batch as 1 for that static bound, then splits each request dynamically
    (``prepare_varlen_num_splits``) when ``b <= 992``; above that every request runs unsplit.

    MLA is mapped as MQA (``Hkv = 1``, ``group = H``). FA2 sees ``d = head_dim_qk``; FA3 uses its q_v path
    (``d = head_dim_qk - head_dim_v`` RoPE dims, ``dv = head_dim_v``) when that difference is in (0, 64]. The
    page table is assumed tight (``seqlen_k = cdiv(ctx_len, page) * page``). ``Plan.block_n`` is the kBlockN.
    """
    if dev.arch == "sm_90":
        return _plan_fa3(w, dev)
    return _plan_fa2(w, dev)
