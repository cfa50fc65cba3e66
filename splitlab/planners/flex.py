"""PyTorch FlexDecoding's split count (``get_split_k``) and the adapter that maps a decode onto it.

Source: ``pytorch/pytorch`` ``torch/_inductor/kernel/flex/flex_decoding.py`` @
``5f65158aefc31977355102011b310a7d020e5604`` (docs/planners.md section 5; read at that commit, index id 393268439).
"""

from __future__ import annotations

from splitlab.devices import DeviceSpec
from splitlab.errors import check_int
from splitlab.intmath import next_power_of_two
from splitlab.planners.registry import Plan, register
from splitlab.workloads import DecodeWorkload

FLEX_SOURCE = ("pytorch/pytorch torch/_inductor/kernel/flex/flex_decoding.py @ "
               "5f65158aefc31977355102011b310a7d020e5604")


def get_split_k(B: int, H: int, num_sms: int) -> int:
    """FlexDecoding ``get_split_k``: ``max((num_SM // max(B * H, 1)) * 2, 1)``.

    Two splits per SM's worth of (batch, kv head) programs, floor division first; ``H`` is the KV-head count
    the caller passes. Upstream's third argument ``Mk`` (keys) is unused and dropped; ``num_SM`` is the CUDA
    ``multi_processor_count`` (upstream reads it from the device; here it is explicit). Source:
    ``pytorch/pytorch`` ``torch/_inductor/kernel/flex/flex_decoding.py`` @ ``5f65158a``.
    """
    B = check_int("B", B, minimum=0)
    H = check_int("H", H, minimum=0)
    num_sms = check_int("num_sms", num_sms, minimum=0)
    bh = max(B * H, 1)  # NOTE: Handle B*h=0 case
    split_k = num_sms // bh * 2  # Each SM should at least get one block.
    split_k = max(split_k, 1)
    return split_k


@register("flex", kinds=("gqa", "mla"), source=FLEX_SOURCE)
def plan_flex(w: DecodeWorkload, dev: DeviceSpec) -> Plan:
    """FlexDecoding's ``SPLIT_KV`` for ``w``: ``get_split_k(batch, Hkv, sm_count)`` with ``Hkv`` the KV heads
    (``gqa``) or 1 (``mla``, treated as MQA). The query heads of a group share one program (``BLOCK_M =
    max(next_pow2(group), 16)`` rows). ``_use_flex_decoding`` needs a power-of-two group; otherwise the main
    flex_attention kernel runs, without split-K (``num_splits = 1``).
    """
    hkv = w.num_kv_heads if w.kind == "gqa" else 1
    group = w.num_q_heads // hkv
    block_m = max(next_power_of_two(group), 16)
    if group & (group - 1):
        return Plan("flex", 1, note=f"group {group} is not a power of two: upstream falls back to the main "
                    "flex_attention kernel (no split-K)", extra={"flex_decoding": False})
    num_splits = get_split_k(w.batch, hkv, dev.sm_count)
    note = (f"get_split_k(B={w.batch}, H=Hkv={hkv}, num_SM={dev.sm_count}) = max({dev.sm_count} // "
            f"{max(w.batch * hkv, 1)} * 2, 1)")
    if w.kind == "mla":
        note += f"; MLA as MQA (Hkv=1, group={group})"
    return Plan("flex", num_splits, note=note, extra={"flex_decoding": True, "BLOCK_M": block_m})
