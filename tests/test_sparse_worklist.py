"""The sparse top-k MLA work-list kernel (``kernels.sparse_mla.sparse_mla_decode_scheduled``) under Triton's
interpreter: every sparse scheduler's schedule against the fp64 reference, per-token walked lengths (positions past
a token's length never read), tokens of only -1, poisoned outputs, NaN rows, an fp8 pool, the split-count kernel at
the same split, and one-line refusals."""

from __future__ import annotations

import pytest
import torch
from sm90 import compile_in_child

from splitlab.errors import SplitlabError
from splitlab.kernels import reference
from splitlab.kernels.accuracy import TOLERANCE, assert_matches_reference, assert_same_nonfinite, fp8_query, rel_err
from splitlab.kernels.inputs import poison_unread_slots_, quantize_fp8, sparse_mla_inputs
from splitlab.kernels.sparse_mla import (
    sparse_mla_decode,
    sparse_mla_decode_scheduled,
    sparse_mla_defaults,
    walked_indices,
)
from splitlab.kernels.worklist import WorkList
from splitlab.planners import schedulers as S


def schedules(lens: list[int], tile: int) -> list:
    """uniform (request-major, as the split-count grid; 3 splits and unsplit), stream-K (persistent: a slot's items
    cross tokens), balanced chunks, cut at ``tile`` positions, and FlashMLA's (persistent, 32-key blocks here)."""
    return [S.uniform(lens, 3, tile=tile, request_major=True), S.uniform(lens, 1, tile=tile),
            S.stream_k(lens, 5, tile=tile), S.by_chunk(lens, 2 * tile, align=tile),
            S.flashmla(lens, 3, block_size_n=2 * tile, fixed_overhead_num_blocks=1)]


def run(x: dict, s, dv: int, **knobs):
    return sparse_mla_decode_scheduled(**x, work=WorkList.from_schedule(s, "cpu"), head_dim_v=dv, return_lse=True,
                                       **knobs)


def check_written(allocs: list, s) -> None:
    """out and lse fully written, and the partial rows when the schedule has any (NaN-filled at allocation)."""
    written = allocs[:4] if s.partial_rows else allocs[:2]
    for t in written:
        assert not torch.isnan(t).any(), s.scheduler


# (dtype, T, H, Dqk, Dv, topk, num_slots, empty_rows, block_k, block_h)
CASES = [
    (torch.float32, 4, 5, 48, 32, 100, 300, 1, 16, None),  # odd heads, rope 16, a token of only -1
    (torch.bfloat16, 3, 5, 48, 32, 70, 200, 0, 16, None),
    (torch.float16, 3, 20, 32, 32, 40, 64, 1, 16, 16),  # Dqk == Dv, two head tiles (odd remainder: 4 heads)
]


@pytest.mark.parametrize("dtype,T,H,Dqk,Dv,topk,slots,empty,block_k,block_h", CASES)
def test_every_schedule_matches_reference(allocs, dtype, T, H, Dqk, Dv, topk, slots, empty, block_k, block_h):
    x = sparse_mla_inputs(T, H, Dqk, topk, num_slots=slots, invalid_frac=0.3, empty_rows=empty, dtype=dtype,
                          seed=H + topk)
    ref, ref_lse = reference.sparse_mla_decode(**x, head_dim_v=Dv, return_lse=True)
    rows = [t for t in range(T) if (x["indices"][t] < 0).all()]
    for s in schedules([topk] * T, block_k):
        allocs.clear()
        out, lse = run(x, s, Dv, block_k=block_k, block_h=block_h)
        assert_matches_reference(out, lse, ref, ref_lse, dtype, rows)
        check_written(allocs, s)


def test_per_token_lengths_walk_only_their_prefix(allocs):
    """Tokens walk 0 to topk positions: the entries past a token's length are real slots whose rows hold NaN (never
    read), and the result is the reference's on the walked prefix (the rest -1)."""
    lens = [100, 0, 37, 1, 64]
    x = sparse_mla_inputs(5, 5, 48, 100, num_slots=400, invalid_frac=0.2, dtype=torch.float32, seed=7)
    walked = walked_indices(x["indices"], tuple(lens))
    assert (x["indices"] >= 0).sum() > (walked >= 0).sum()  # something is left unwalked
    poison_unread_slots_(x["kv_cache"], walked)
    ref, ref_lse = reference.sparse_mla_decode(**dict(x, indices=walked), head_dim_v=32, return_lse=True)
    for s in schedules(lens, 16):
        allocs.clear()
        out, lse = run(x, s, 32, block_k=16)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [1])
        check_written(allocs, s)


def test_tokens_of_only_invalid_indices_give_zeros_and_minus_inf():
    """Every item of a token sees only -1 (split three ways, or one item): zeros and lse -inf, the merge never
    poisoned by the empty partials."""
    x = sparse_mla_inputs(3, 5, 48, 60, num_slots=90, empty_rows=2, dtype=torch.float16, seed=4)
    for s in schedules([60] * 3, 16):
        out, lse = run(x, s, 32, block_k=16)
        assert torch.all(out[1:] == 0) and torch.all(torch.isneginf(lse[1:])), s.scheduler
        assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()


def test_same_as_the_split_count_kernel_at_the_same_split():
    """uniform(topk, S) cut at BLOCK_K, request-major, is the split-count grid: the same result within fp32
    rounding (the merge kernel against ``combine``)."""
    x = sparse_mla_inputs(3, 5, 48, 100, num_slots=300, invalid_frac=0.3, empty_rows=1, dtype=torch.float32, seed=2)
    for n in (1, 3, 7):
        want, want_lse = sparse_mla_decode(**x, head_dim_v=32, num_splits=n, block_k=16, return_lse=True)
        out, lse = run(x, S.uniform([100] * 3, n, tile=16, request_major=True), 32, block_k=16)
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


def test_views_custom_scale_and_knobs():
    """Non-contiguous q, pool and indices (as ``sparse_mla_decode``'s test), sm_scale, BLOCK_H 32, 2 warps."""
    g = torch.Generator().manual_seed(6)
    x = sparse_mla_inputs(2, 6, 48, 40, num_slots=60, dtype=torch.float32, seed=3)
    kv_wide = torch.randn(60, 64, generator=g)
    kv_wide[:, 4:52] = x["kv_cache"]
    idx_wide = torch.full((2, 80), -7, dtype=torch.int32)
    idx_wide[:, ::2] = x["indices"]
    q_wide = torch.randn(2, 12, 48, generator=g)
    q_wide[:, ::2] = x["q"]
    views = dict(q=q_wide[:, ::2], kv_cache=kv_wide[:, 4:52], indices=idx_wide[:, ::2])
    assert not any(t.is_contiguous() for t in views.values())
    ref, ref_lse = reference.sparse_mla_decode(**x, head_dim_v=32, sm_scale=0.2, return_lse=True)
    for s in (S.uniform([40, 40], 2, tile=16), S.stream_k([40, 40], 3, tile=16)):
        out, lse = run(views, s, 32, sm_scale=0.2, block_k=16, block_h=32, num_warps=2)
        assert_matches_reference(out, lse, ref, ref_lse, torch.float32, [])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf
def test_a_nan_row_reaches_its_token_only():
    x = sparse_mla_inputs(2, 5, 48, 64, num_slots=100, invalid_frac=0.2, dtype=torch.float32, seed=41)
    slot = int(x["indices"][0][x["indices"][0] >= 0][20])
    x["indices"][1][x["indices"][1] == slot] = -1
    x["kv_cache"][slot, 3] = float("nan")
    ref = reference.sparse_mla_decode(**x, head_dim_v=32)
    for s in schedules([64, 64], 16):
        out, _ = run(x, s, 32, block_k=16)
        assert_same_nonfinite(out, ref, torch.float32)
        assert torch.isnan(out[0]).all() and not torch.isnan(out[1]).any()


def test_fp8_pool():
    """An e4m3 pool holding K / kv_scale, dequantised in-kernel (as ``sparse_mla_decode``'s test)."""
    x = sparse_mla_inputs(3, 5, 48, 80, num_slots=200, invalid_frac=0.3, empty_rows=1, dtype=torch.bfloat16, seed=5)
    kv_scale = 2.5
    x8 = dict(x, kv_cache=quantize_fp8(x["kv_cache"], kv_scale))
    bh = sparse_mla_defaults(5, 48, "fp8_e4m3").block_h
    ref, ref_lse = reference.sparse_mla_decode(**dict(x8, q=fp8_query(x["q"], bh)), head_dim_v=32, kv_scale=kv_scale,
                                               return_lse=True)
    for s in (S.uniform([80] * 3, 3, tile=32, request_major=True), S.stream_k([80] * 3, 4, tile=32)):
        out, lse = run(x8, s, 32, kv_scale=kv_scale, block_k=32)
        assert_matches_reference(out, lse, ref, ref_lse, torch.bfloat16, [2])


def test_an_item_past_topk_on_the_device_makes_its_token_nan():
    """A work list edited past the checks (an item ending past topk): nothing outside the row is read, the token
    comes out NaN, the others right."""
    x = sparse_mla_inputs(2, 5, 48, 40, num_slots=60, dtype=torch.float32, seed=3)
    ref = reference.sparse_mla_decode(**x, head_dim_v=32)
    work = WorkList.from_schedule(S.uniform([40, 40], 2, tile=16), "cpu")
    work.items[work.items[:, 0] == 1, 2] = 1000
    out = sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32, block_k=16)
    assert torch.isnan(out[1]).all() and rel_err(out[0], ref[0]) <= TOLERANCE[torch.float32]


def test_indices_are_checked_over_the_walked_prefix_only():
    x = sparse_mla_inputs(2, 4, 48, 20, num_slots=30, dtype=torch.float32, seed=42)
    work = WorkList.from_schedule(S.uniform([20, 10], 1), "cpu")
    x["indices"][1, 15] = 99  # past token 1's length: never read, not refused
    ref = reference.sparse_mla_decode(**dict(x, indices=walked_indices(x["indices"], (20, 10))), head_dim_v=32)
    out = sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32)
    assert rel_err(out, ref) <= TOLERANCE[torch.float32]
    x["indices"][1, 5] = 99  # inside it: refused, or NaN unchecked
    for knobs in ({}, dict(validate=True)):
        with pytest.raises(SplitlabError, match=r"^indices has values in"):
            sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32, **knobs)
    out = sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32, validate=False)
    assert torch.isnan(out[1]).all() and rel_err(out[0], ref[0]) <= TOLERANCE[torch.float32]


def test_a_ragged_walk_builds_nothing_on_the_host_unless_it_checks(monkeypatch):
    # Under a CUDA graph capture (and with validate=False) the walked positions are neither built nor checked: their
    # build copies the lengths to the device, which a capture refuses (the H200 A/B's ragged top-k batches).
    import splitlab.kernels.sparse_mla as smla

    x = sparse_mla_inputs(2, 4, 48, 20, num_slots=30, dtype=torch.float32, seed=42)
    work = WorkList.from_schedule(S.uniform([20, 10], 1), "cpu")
    ref = reference.sparse_mla_decode(**dict(x, indices=walked_indices(x["indices"], (20, 10))), head_dim_v=32)

    def refuse(*a):
        raise AssertionError("walked_indices built")
    monkeypatch.setattr(smla, "walked_indices", refuse)
    out = sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32, validate=False)
    monkeypatch.setattr(smla, "capturing", lambda t: True)
    out2 = sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32)
    assert rel_err(out, ref) <= TOLERANCE[torch.float32] and torch.equal(out, out2)


def test_refusals_are_one_line():
    x = sparse_mla_inputs(2, 4, 48, 20, num_slots=30, dtype=torch.float32)
    cases = [
        (S.uniform([20, 20], 2), "expected a WorkList"),
        (WorkList.from_schedule(S.uniform([20, 20, 20], 1), "cpu"), "for 3 requests; q has 2"),
        (WorkList.from_schedule(S.uniform([20, 21], 1), "cpu"), "walks up to position 21 .* indices has 20 columns"),
    ]
    for work, says in cases:
        with pytest.raises(SplitlabError, match=says) as e:
            sparse_mla_decode_scheduled(**x, work=work, head_dim_v=32)
        assert "\n" not in str(e.value)
    work = WorkList.from_schedule(S.uniform([20, 20], 1), "cpu")
    for changes, name in ((dict(q=x["q"][0]), "q"), (dict(indices=x["indices"].long()), "indices"),
                          (dict(kv_cache=x["kv_cache"][:, :40]), "kv_cache")):
        with pytest.raises(SplitlabError, match=rf"^{name}\b"):
            sparse_mla_decode_scheduled(**dict(x, **changes), work=work, head_dim_v=32)
    for knobs, name in ((dict(head_dim_v=49), "head_dim_v"), (dict(block_k=24), "block_k"),
                        (dict(block_h=128), "block_h"), (dict(num_warps=6), "num_warps"),
                        (dict(sm_scale=float("inf")), "sm_scale"), (dict(kv_scale=0.5), "kv_scale")):
        with pytest.raises(SplitlabError, match=rf"^{name}\b"):
            sparse_mla_decode_scheduled(**x, work=work, **{"head_dim_v": 32, **knobs})


SM90_SCRIPT = r"""
import splitlab.kernels._launch as launch_common
import splitlab.kernels.combine as comb
import splitlab.kernels.sparse_mla as smla
import splitlab.kernels.worklist as wl
from splitlab.kernels.inputs import sparse_mla_inputs
from splitlab.planners import schedulers as S

smla._sparse_mla_worklist_kernel = Warmup(smla._sparse_mla_worklist_kernel)
import splitlab.kernels.workitems as wi
wi._merge_kernel = Warmup(wi._merge_kernel)
comb._combine_kernel = Warmup(comb._combine_kernel)
launch_common.check_launch_device = lambda *a: None  # CPU tensors stand in for GPU ones; nothing is launched
SMEM_LIMIT = 232448  # sm_90's opt-in shared memory per block

failed = False
lens = [256, 256]
cases = [(h, dqk, "one item", S.uniform(lens, 2, request_major=True)) for h in (64, 128) for dqk in (512, 576)]
cases.append((64, 512, "persistent", S.stream_k(lens, 3)))
for h, dqk, label, s in cases:
    x = sparse_mla_inputs(2, h, dqk, 256, num_slots=300, invalid_frac=0.3, dtype=torch.bfloat16)
    n0 = len(compiled)
    smla.sparse_mla_decode_scheduled(**x, work=wl.WorkList.from_schedule(s, "cpu"), head_dim_v=512, validate=False)
    k = compiled[n0]
    usage = "?"
    if os.path.exists(cuobjdump):
        usage = resource_line(k)
        stack = int(re.search(r"STACK:(\d+)", usage).group(1)) if "STACK:" in usage else -1
        if label == "one item" and (stack != 0 or "LOCAL:0 " not in usage):
            print(f"SPILL {h}/{dqk} {label}: {usage}")
            failed = True
    if k.metadata.shared > SMEM_LIMIT:
        print(f"SHARED {h}/{dqk} {label}: {k.metadata.shared} B > {SMEM_LIMIT}")
        failed = True
    print(f"ok {h}/{dqk} {label}: shared {k.metadata.shared} B; {usage}")
sys.exit(1 if failed else 0)
"""


def test_the_work_list_kernel_compiles_for_sm90():
    """sm_90a, bf16, the default tile (BLOCK_H 64, BLOCK_K 64, 8 warps, 2 stages) at 64/128 heads and Dqk 512/576:
    one item a slot compiles without spills (236-255 registers, as the split-count tile's 224-255); the persistent
    loop compiles (255 registers and ~0.5 KB of stack, as the GQA/MLA persistent kernels: ``schedulers.STREAM_K_WAVES``)
    and fits shared memory."""
    compile_in_child(SM90_SCRIPT)
