"""SGLang's Triton decode split count (``get_num_kv_splits`` / ``get_num_kv_splits_triton``) and its MLA cap.

Sources (docs/planners.md section 6.1):

* kernel ``get_num_kv_splits_triton``: ``sgl-project/sglang``
  ``python/sglang/srt/layers/attention/triton_ops/metadata.py`` @ ``bdd1bcdf4715964dddaa81acc590bd3b74a45acc``
  (read at that commit, index id 55035894249);
* host ``TritonAttnBackend.get_num_kv_splits`` and ``_mla_decode_kv_splits_cap``:
  ``python/sglang/srt/layers/attention/triton_backend.py`` @ ``00858422264b0552a4c0a21a9949c3986d0dec97``
  (read at that commit, index id 55561973927).

The kernel's ``ext_device_core_count`` is float32 arithmetic cast to int32 (truncation toward zero); the port
uses ``numpy.float32`` with numpy's ``log2``. Triton may lower ``tl.log2`` to an approximate instruction on a
GPU, so a value can differ only where ``cores * log2(max_len / 64)`` lands within about an ulp of an integer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitlab.devices import DeviceSpec
from splitlab.errors import bad, check_int
from splitlab.intmath import cdiv, next_power_of_two
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

KERNEL_SOURCE = ("sgl-project/sglang python/sglang/srt/layers/attention/triton_ops/metadata.py @ "
                 "bdd1bcdf4715964dddaa81acc590bd3b74a45acc")
HOST_SOURCE = ("sgl-project/sglang python/sglang/srt/layers/attention/triton_backend.py @ "
               "00858422264b0552a4c0a21a9949c3986d0dec97")

DEFAULT_MAX_KV_SPLITS = 8  # server arg triton_attention_num_kv_splits
_MLA_DECODE_MIN_BLOCK_KV = 32
_f32 = np.float32


def _get_num_kv_splits_triton(seq_lens: Sequence[int], num_group: int, num_head: int, num_kv_head: int,
                              max_kv_splits: int, device_core_count: int) -> list[int]:
    """The one-program Triton kernel, lane by lane (slot ``i * num_group + g`` holds sequence ``i``)."""
    num_seq = len(seq_lens)
    # masked lanes load 0 for the max and max_seq_len for the min: neither moves the result
    max_seq_len = max(seq_lens)
    min_seq_len = min(seq_lens)
    if max_seq_len * 8 < min_seq_len * 10:
        min_seq_len = max_seq_len
    max_kv_splits_1 = min(cdiv(max_seq_len, min_seq_len), max_kv_splits)
    kv_chunk_size_1 = cdiv(max_seq_len, max_kv_splits_1)

    # NOTE: this is a hack to let num_kv_split grows up with seqlen gradually
    ext_seq_len = _f32(max_seq_len) / _f32(64.0)
    ext_device_core_count = int(_f32(device_core_count) * np.maximum(np.log2(ext_seq_len), _f32(1.0)))
    block_h, num_kv_group = 16, num_head // num_kv_head
    if num_kv_group == 1:
        token_grid = num_seq * num_group * num_head
    else:
        # from triton_ops/decode_attention.py:_decode_grouped_att_m_fwd
        block_h = min(block_h, num_kv_group)
        token_grid = num_seq * num_group * cdiv(num_head, block_h)
    max_kv_splits_2 = min(cdiv(ext_device_core_count, token_grid), max_kv_splits)
    kv_chunk_size_2 = cdiv(max_seq_len, max_kv_splits_2)

    num_kv_splits = [max(cdiv(s, kv_chunk_size_1), cdiv(s, kv_chunk_size_2)) for s in seq_lens]
    out = [0] * (num_seq * num_group)
    for i in range(num_group):
        for seq, value in enumerate(num_kv_splits):
            out[i + seq * num_group] = value
    return out


def get_num_kv_splits(seq_lens: Sequence[int], num_group: int, num_head: int, num_kv_head: int,
                      max_kv_splits: int, device_core_count: int, *, static_kv_splits: bool = False,
                      split_tile_size: int | None = None, enable_deterministic: bool = False) -> list[int]:
    """SGLang ``get_num_kv_splits`` (host) and ``get_num_kv_splits_triton`` (kernel) emulated.

    Kernel rule: ``max_len``/``min_len`` over the batch (``min_len = max_len`` when ``max_len * 8 < min_len *
    10``); ``chunk1 = cdiv(max_len, min(cdiv(max_len, min_len), max_kv_splits))``; ``ext_cores =
    int32(float32(cores) * max(log2(float32(max_len) / 64), 1))``; ``token_grid = num_seq * num_group *
    num_head`` (group 1) or ``* cdiv(num_head, min(16, group))``; ``chunk2 = cdiv(max_len, min(cdiv(ext_cores,
    token_grid), max_kv_splits))``; sequence ``i`` gets ``max(cdiv(len_i, chunk1), cdiv(len_i, chunk2))``,
    always in ``[1, max_kv_splits]``.

    Returns one value per token slot, ``len(seq_lens) * num_group`` of them, in upstream's layout: slot
    ``i * num_group + g`` holds sequence ``i``'s value (``num_group > 1`` under speculative decoding). With
    ``num_group == 1`` (plain decode) that is one value per sequence. Host paths: ``static_kv_splits`` or
    ``device_core_count <= 0`` fill ``max_kv_splits`` (unless deterministic); deterministic with a
    ``split_tile_size`` gives ``cdiv(len_i, split_tile_size)``.

    Upstream divides by the shortest length, so every length must be >= 1 (a decode always has its new token).
    Source: ``sgl-project/sglang`` ``triton_ops/metadata.py`` @ ``bdd1bcdf`` and ``triton_backend.py`` @
    ``00858422`` (planners.md 6.1).
    """
    seq_lens = [check_int("seq_lens[i]", s) for s in seq_lens]
    if not seq_lens:
        raise bad("seq_lens", seq_lens, "at least one sequence")
    num_group = check_int("num_group", num_group)
    num_head = check_int("num_head", num_head)
    num_kv_head = check_int("num_kv_head", num_kv_head)
    if num_kv_head > num_head:
        raise bad("num_kv_head", num_kv_head, f"<= num_head ({num_head})")
    max_kv_splits = check_int("max_kv_splits", max_kv_splits)
    device_core_count = check_int("device_core_count", device_core_count, minimum=None)
    num_seq = len(seq_lens)

    if (static_kv_splits or device_core_count <= 0) and not enable_deterministic:
        return [max_kv_splits] * (num_seq * num_group)
    if split_tile_size is not None and enable_deterministic:
        split_tile_size = check_int("split_tile_size", split_tile_size)
        return [cdiv(s, split_tile_size) for s in seq_lens for _ in range(num_group)]
    return _get_num_kv_splits_triton(seq_lens, num_group, num_head, num_kv_head, max_kv_splits,
                                     device_core_count)


def mla_decode_kv_splits_cap(base: int, sm_count: int, context_len: int) -> int:
    """SGLang ``_mla_decode_kv_splits_cap``: ``max(base, min(next_pow2(sm_count), next_pow2(cdiv(context_len,
    32))))``, or ``base`` when ``sm_count <= 0``. Upstream passes the model's maximum context length
    (``model_config.context_len``) and, on gfx942, caps the result at 256.

    Source: ``sgl-project/sglang`` ``python/sglang/srt/layers/attention/triton_backend.py`` @ ``00858422``.
    """
    base = check_int("base", base)
    sm_count = check_int("sm_count", sm_count, minimum=None)
    context_len = check_int("context_len", context_len)
    if sm_count <= 0:
        return base
    sm_cap = next_power_of_two(sm_count)
    ctx_cap = next_power_of_two(cdiv(context_len, _MLA_DECODE_MIN_BLOCK_KV))
    return max(base, min(sm_cap, ctx_cap))


@register("sglang", kinds=("gqa", "mla"), source=f"{KERNEL_SOURCE}; {HOST_SOURCE}")
def plan_sglang(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """SGLang Triton backend decode: ``seq_lens = w.lengths``, ``num_group = 1`` (no speculative decoding),
    ``num_head = H``, ``num_kv_head = Hkv`` (1 for MLA), ``device_core_count = sm_count``; ``max_kv_splits``
    is the default 8 for ``gqa`` and the MLA cap for ``mla`` (with ``ctx_len`` standing in for the model's
    maximum context, so the cap is at most upstream's; 256 at most on gfx942). ``per_request`` holds the
    per-sequence values, ``num_splits`` their maximum (the grid's split axis is ``max_kv_splits``).
    """
    num_kv_head = w.num_kv_heads if w.kind == "gqa" else 1
    if w.kind == "mla":
        max_kv_splits = mla_decode_kv_splits_cap(DEFAULT_MAX_KV_SPLITS, dev.sm_count, w.ctx_len)
        if dev.arch == "gfx942":
            max_kv_splits = min(max_kv_splits, 256)
    else:
        max_kv_splits = DEFAULT_MAX_KV_SPLITS
    seq_lens = [max(n, 1) for n in w.lengths]
    per = get_num_kv_splits(seq_lens, 1, w.num_q_heads, num_kv_head, max_kv_splits, dev.sm_count)
    group = w.num_q_heads // num_kv_head
    note = (f"get_num_kv_splits(num_group=1, num_head={w.num_q_heads}, num_kv_head={num_kv_head}, "
            f"max_kv_splits={max_kv_splits}, device_core_count={dev.sm_count})")
    if w.kind == "mla":
        note += f"; MLA cap from ctx_len={w.ctx_len} (upstream: the model's max context)"
    if any(n < 1 for n in w.lengths):
        note += "; zero-length requests counted as 1 key (a decode always holds its new token)"
    return Plan("sglang", max(per), block_h=1 if group == 1 else min(16, group), per_request=tuple(per),
                note=note, extra={"max_kv_splits": max_kv_splits})
