"""Unvalidated hostile inputs on the GPU: every kernel stays inside its cache, pool and block table, and the requests
that read nothing bad are right. Run in its own process by ``test_kernels_gpu.py`` (a fault there would spoil the
CUDA context of the whole session), or alone: ``python tests/gpu/hostile.py``; under
``compute-sanitizer --tool memcheck`` it also proves that no read leaves its buffer. Prints ``ok <case>`` or
``FAIL <case>: why`` a line; exit code 1 if anything failed.

A length outside the block table makes its request NaN on every kernel; a block-table entry or a sparse index out
of range makes it NaN on the Triton kernels and leaves it undefined (but in bounds) on the Gluon tile
(``splitlab.kernels._launch``, "Validation of values")."""

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's splitlab, installed or not

import torch  # noqa: E402

from splitlab.errors import SplitlabError  # noqa: E402
from splitlab.kernels import mla_sm90, reference  # noqa: E402
from splitlab.kernels.accuracy import TOLERANCE, rel_err  # noqa: E402
from splitlab.kernels.gqa import gqa_decode  # noqa: E402
from splitlab.kernels.inputs import gqa_inputs, mla_inputs, sparse_mla_inputs  # noqa: E402
from splitlab.kernels.mla import mla_decode  # noqa: E402
from splitlab.kernels.sparse_mla import sparse_mla_decode  # noqa: E402

TOL = TOLERANCE[torch.bfloat16]
failed: list[str] = []


def case(name: str, fn) -> None:
    try:
        fn()
        torch.cuda.synchronize()  # an asynchronous fault surfaces here, in this case
        print(f"ok {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the exit code says it
        failed.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()


def check(out: torch.Tensor, ref: torch.Tensor, bad: int, *, nan: bool) -> None:
    """Row ``bad`` is all NaN (``nan``) or anything; every other row matches the reference."""
    others = [i for i in range(out.shape[0]) if i != bad]
    if nan and not torch.isnan(out[bad]).all():
        raise AssertionError(f"row {bad} is not all NaN ({int(torch.isnan(out[bad]).sum())} NaN)")
    err = rel_err(out[others], ref[others])
    if not err <= TOL:
        raise AssertionError(f"the other rows: rel_err {err:.3g} > {TOL}")


def gqa_page(bad_page: int, s: int) -> None:
    x = gqa_inputs(3, 32, 8, 128, [3000, 777, 64], page_size=16, device="cuda", seed=1)
    ref = reference.gqa_decode(**x)
    x["block_table"][1, 20] = bad_page
    check(gqa_decode(**x, num_splits=s), ref, 1, nan=True)


def gqa_len(bad_len: int) -> None:
    x = gqa_inputs(3, 32, 8, 128, [3000, 777, 64], page_size=16, device="cuda", seed=2)
    ref = reference.gqa_decode(**x)
    x["seq_lens"][0] = bad_len
    check(gqa_decode(**x, num_splits=4), ref, 0, nan=True)


def mla_page(gluon: bool, bad_page: int, s: int) -> None:
    mla_sm90.ENABLED = gluon
    x = mla_inputs(3, 128, 576, [3000, 777, 64], page_size=64, device="cuda", seed=3)
    ref = reference.mla_decode(**x)
    x["block_table"][1, 5] = bad_page
    check(mla_decode(**x, num_splits=s), ref, 1, nan=not gluon)  # the Gluon tile: in bounds, undefined


def mla_len(gluon: bool, bad_len: int) -> None:
    mla_sm90.ENABLED = gluon
    x = mla_inputs(3, 128, 576, [3000, 777, 64], page_size=64, device="cuda", seed=4)
    ref = reference.mla_decode(**x)
    x["seq_lens"][2] = bad_len
    check(mla_decode(**x, num_splits=7), ref, 2, nan=True)


def sparse_index(gluon: bool, bad_index: int, s: int) -> None:
    mla_sm90.ENABLED = gluon
    x = sparse_mla_inputs(3, 128, 576, 2048, num_slots=20_000, invalid_frac=0.2, device="cuda", seed=5)
    ref = reference.sparse_mla_decode(**x)
    x["indices"][1, 1000] = bad_index
    out = sparse_mla_decode(**x, num_splits=s, block_h=64, block_k=64, validate=False)
    check(out, ref, 1, nan=not gluon)


def capture() -> None:
    """Validation asked for under graph capture is refused before any work; sparse MLA's default there skips its
    check (no sync) and the captured call replays the eager result."""
    x = gqa_inputs(2, 32, 8, 128, [300, 50], page_size=16, device="cuda", seed=6)
    z = sparse_mla_inputs(2, 64, 512, 512, num_slots=5000, device="cuda", seed=7)
    eager = sparse_mla_decode(**z, num_splits=2)
    gqa_decode(**x, num_splits=2)  # compiled outside the capture
    g = torch.cuda.CUDAGraph()
    refused = None
    with torch.cuda.graph(g):
        try:
            gqa_decode(**x, num_splits=2, validate=True)
        except SplitlabError as e:
            refused = str(e)
        out = sparse_mla_decode(**z, num_splits=2)
    g.replay()
    torch.cuda.synchronize()
    if refused is None or "capturing a CUDA graph" not in refused:
        raise AssertionError(f"validate=True under capture was not refused: {refused!r}")
    if not torch.equal(out, eager):
        raise AssertionError("the captured sparse call differs from the eager one")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("hostile.py: no CUDA GPU here", file=sys.stderr)
        sys.exit(2)
    for page in (10**6, -5):
        for s in (1, 4):
            case(f"gqa page {page} S={s}", lambda page=page, s=s: gqa_page(page, s))
    for n in (10**9, -3):
        case(f"gqa length {n}", lambda n=n: gqa_len(n))
    for gluon in (False, True):
        for page in (10**6, -5):
            for s in (1, 7):
                case(f"mla page {page} S={s} gluon={gluon}", lambda g=gluon, p=page, s=s: mla_page(g, p, s))
        case(f"mla length past the table gluon={gluon}", lambda g=gluon: mla_len(g, 10**9))
        for idx in (20_000, 10**6, -7):
            for s in (1, 3):
                case(f"sparse index {idx} S={s} gluon={gluon}", lambda g=gluon, i=idx, s=s: sparse_index(g, i, s))
    mla_sm90.ENABLED = True
    case("graph capture", capture)
    print(f"hostile: {len(failed)} failed" if failed else "hostile: all cases ok")
    sys.exit(1 if failed else 0)
