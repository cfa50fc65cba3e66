"""The kernels' inputs and accuracy checks under their former module name, kept for code that still imports them
from here (scripts under ``experiments/``); they live in ``splitlab.kernels.inputs`` (what a launch takes) and
``splitlab.kernels.accuracy`` (how its output is checked against the fp64 reference)."""

from splitlab.kernels.accuracy import (
    FP8_QUANT_TOLERANCE,
    LSE_TOLERANCE,
    TOLERANCE,
    assert_matches_reference,
    assert_same_nonfinite,
    fp8_query,
    lse_err,
    reference_inputs,
    references,
    rel_err,
)
from splitlab.kernels.inputs import (
    DTYPES,
    gqa_inputs,
    mla_inputs,
    paged_layout,
    poison_,
    poison_unread_pages_,
    poison_unread_slots_,
    quantize_fp8,
    query_dtype,
    set_key_,
    sparse_mla_inputs,
    strided_lens,
    workload_inputs,
)

__all__ = ["DTYPES", "FP8_QUANT_TOLERANCE", "LSE_TOLERANCE", "TOLERANCE", "assert_matches_reference",
           "assert_same_nonfinite", "fp8_query", "gqa_inputs", "lse_err", "mla_inputs", "paged_layout", "poison_",
           "poison_unread_pages_", "poison_unread_slots_", "quantize_fp8", "query_dtype", "reference_inputs",
           "references", "rel_err", "set_key_", "sparse_mla_inputs", "strided_lens", "workload_inputs"]
