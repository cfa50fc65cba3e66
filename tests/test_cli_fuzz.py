"""Fuzz ``splitlab plan``'s arguments (ragged batches too: ``--lengths``, ``--seq-lens``): whatever the values, the
command answers (exit 0, a table or JSON on stdout) or refuses in one line on stderr (exit 2); never a traceback,
another exception or another exit code. The workload bounds (``workloads.LIMITS``) keep every planner fast, so no
example can hang."""

from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from splitlab import devices, planners, workloads
from splitlab.cli import main
from splitlab.workloads import LIMITS


def _hostile_int(limit: int) -> st.SearchStrategy[str]:
    """The edges, huge values, floats and junk (and now and then a valid small one)."""
    return st.one_of(
        st.integers(1, 300).map(str),
        st.sampled_from([0, -1, 1, limit, limit + 1, 10**12, 2**63, 10**40]).map(str),
        st.sampled_from(["1e30", "1.5", "nan", "inf", "", " ", "0x10", "1_000", "٣", "--", "-x", "1,2"]),
        st.text(max_size=6),
    )


def _valid_int(limit: int) -> st.SearchStrategy[str]:
    """Integers in range: the powers of two a model has (and the bound itself), or any."""
    return st.one_of(st.sampled_from([1 << k for k in range(limit.bit_length()) if 1 << k <= limit] + [limit]),
                     st.integers(1, limit)).map(str)


def _list(values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(values, st.lists(values, min_size=1, max_size=3).map(",".join))


# One device of each planner path (SM90, SM100, small SM12x, CDNA) as often as all the others together.
_devices = st.lists(st.one_of(st.sampled_from(["h200", "b200", "gb10", "mi355x"]), st.sampled_from(devices.names())),
                    min_size=1, max_size=3).map(",".join)
_planners = st.one_of(st.just("all"), st.lists(st.sampled_from(planners.names()), min_size=1, max_size=3).map(",".join))
_INTS = {"--heads": "num_q_heads", "--kv-heads": "num_kv_heads", "--head-dim": "head_dim_qk",
         "--head-dim-v": "head_dim_v", "--topk": "topk", "--page-size": "page_size"}

_DRAWN = [d for d, spread in workloads.LENGTH_DISTS.items() if spread is not None]
_seeded = st.tuples(st.sampled_from(_DRAWN), st.integers(0, workloads.MAX_LENGTH_SEED)).map("{0[0]}:{0[1]}".format)
_lengths = st.one_of(st.sampled_from(list(workloads.LENGTH_DISTS)), _seeded)
_seq_lens = st.lists(st.one_of(st.integers(0, 300), st.integers(0, LIMITS["ctx_len"])), min_size=1, max_size=6) \
    .filter(lambda lens: max(lens) > 0).map(lambda lens: ",".join(map(str, lens)))

# Each flag's values: (valid ones, hostile ones).
FLAGS = {
    "--workload": (st.sampled_from(workloads.names()), st.sampled_from(["gpt-5", "", "LLAMA-3-8B", "llama-3-8b "])),
    "--kind": (st.sampled_from(workloads.KINDS), st.sampled_from(["dense", "", "GQA"])),
    "--batch": (_list(_valid_int(LIMITS["batch"])), _list(_hostile_int(LIMITS["batch"]))),
    "--ctx": (_list(_valid_int(LIMITS["ctx_len"])), _list(_hostile_int(LIMITS["ctx_len"]))),
    **{flag: (_valid_int(LIMITS[field]), _hostile_int(LIMITS[field])) for flag, field in _INTS.items()},
    "--dtype": (st.sampled_from(workloads.DTYPES), st.sampled_from(["int4", "", "BF16"])),
    "--device": (_devices, st.sampled_from(["tpu", "", "h200,", ",", "all", "h200,,b200"])),
    "--planner": (_planners, st.sampled_from(["magic", "", "modular,", "ALL", "all,modular"])),
    "--lengths": (_lengths, st.one_of(
        st.sampled_from(["spread3", "gauss", "", ":", "uniform:1", "spread16:", "spread16:-1", "spread16:x", "SPREAD16",
                         "spread4:1:2", "spread16:1e3", f"spread16:{workloads.MAX_LENGTH_SEED + 1}",
                         "spread16:" + "9" * 5000]),
        st.text(max_size=8))),
    "--seq-lens": (_seq_lens, st.one_of(_list(_hostile_int(LIMITS["ctx_len"])),
                                        st.sampled_from(["0", "0,0", "-1", "5,-1"]))),
}


@st.composite
def valid_plan_argv(draw) -> list[str]:
    """In-range values that fit together (heads a multiple of kv heads, one kv head and V within the latent for
    MLA, top-k for sparse MLA only): mostly answered, so the planners themselves meet every bound."""
    argv = ["plan", "--device", draw(_devices)]
    if draw(st.booleans()):
        name = draw(st.sampled_from(workloads.names()))
        kind = workloads.get(name).kind
        argv += ["--workload", name]
    else:
        kind = draw(st.sampled_from(workloads.KINDS))
        argv += ["--kind", kind]
    num = {flag: int(draw(_valid_int(LIMITS[field]))) for flag, field in _INTS.items()}
    if kind == "gqa":
        num["--heads"] = num["--kv-heads"] * max(1, num["--heads"] // num["--kv-heads"])
    else:
        num.pop("--kv-heads")
        num["--head-dim-v"] = min(num["--head-dim-v"], num["--head-dim"])
    if kind != "sparse_mla":
        num.pop("--topk")
    flags = draw(st.lists(st.sampled_from(sorted(num)), unique=True))
    if "--head-dim-v" in flags and kind != "gqa" and "--head-dim" not in flags:
        flags.append("--head-dim")  # V within the latent: give the latent too
    if "--heads" in flags and kind == "gqa" and "--kv-heads" not in flags:
        flags.append("--kv-heads")
    for flag in flags:
        argv += [flag, str(num[flag])]
    shape = ["--batch", "--ctx", "--lengths"] if kind == "sparse_mla" or draw(st.booleans()) else ["--seq-lens"]
    for flag in draw(st.lists(st.sampled_from([*shape, "--dtype", "--planner"]), unique=True)):
        argv += [flag, draw(FLAGS[flag][0])]
    return argv + draw(st.lists(st.sampled_from(["--json", "--notes"]), max_size=2, unique=True))


@st.composite
def hostile_plan_argv(draw) -> list[str]:
    """Any flags, each with a valid or a hostile value."""
    argv = ["plan"]
    # A kind or a workload most of the time, sometimes both, or neither.
    first = draw(st.sampled_from(["--kind", "--workload", "--kind", "--workload", "both", "none"]))
    chosen = {"--kind", "--workload"} if first == "both" else set() if first == "none" else {first}
    others = [f for f in FLAGS if f not in ("--kind", "--workload")]
    chosen |= set(draw(st.lists(st.sampled_from(others), max_size=len(others), unique=True)))
    for flag in sorted(chosen):
        valid, bad = FLAGS[flag]
        argv += [flag, draw(bad if draw(st.booleans()) else valid)]
    return argv + draw(st.lists(st.sampled_from(["--json", "--notes"]), max_size=2, unique=True))


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own exits (there is no --help here): reported, not raised
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.one_of(valid_plan_argv(), hostile_plan_argv()))
def test_plan_answers_or_refuses_in_one_line(argv):
    code, out, err = _run(argv)  # any other exception fails the test with its traceback
    event(f"exit {code}")
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert out == "" and err.startswith("splitlab: error: ") and err.count("\n") == 1, (argv, err)
    else:
        assert err == "" and out, argv


def test_the_fuzzer_reaches_both_outcomes():
    # The strategy is not all refusals: a plain kind answers, a zero head count is refused.
    assert _run(["plan", "--kind", "gqa", "--batch", "1,2"])[0] == 0
    assert _run(["plan", "--kind", "gqa", "--heads", "0"])[0] == 2
    assert _run(["plan", "--kind", "mla", "--batch", "3", "--lengths", "spread16:4"])[0] == 0
    assert _run(["plan", "--kind", "gqa", "--seq-lens", "0,70,9"])[0] == 0


def test_every_planner_answers_or_refuses_at_the_corners_of_the_limits():
    # The fuzzer samples; this walks the corners of the documented range on one device per planner path (SM90,
    # SM100, small SM12x, CDNA): every planner returns a plan or a one-line refusal (SplitlabError), at once.
    import time

    from splitlab.cli import plan_rows
    from splitlab.errors import SplitlabError
    from splitlab.workloads import DecodeWorkload

    devs = [devices.get(d) for d in ("h200", "b200", "gb10", "mi355x")]
    big = LIMITS["batch"]
    shapes = []
    for heads in (1, 16, 64, 128, 513, LIMITS["num_q_heads"]):
        for batch, ctx in ((1, 1), (1, 8192), (63, LIMITS["ctx_len"]), (64, 2176), (big, 8192)):
            if batch == big and heads not in (1, LIMITS["num_q_heads"]):
                continue  # the per-request planners walk the batch: two heads counts at the largest one
            for kind in workloads.KINDS:
                try:
                    shapes.append(DecodeWorkload(kind, batch, heads, 1 if kind != "gqa" else heads, 576, 512,
                                                 ctx, page_size=1 if kind == "sparse_mla" else 64,
                                                 topk=min(2048, LIMITS["topk"]) if kind == "sparse_mla" else 0))
                except SplitlabError:
                    pass
    t0 = time.monotonic()
    rows = plan_rows(shapes, devs, planners.names())
    assert rows and all(r["num_splits"] is None or r["num_splits"] >= 1 for r in rows)
    assert any(str(r.get("note", "")).startswith("refused: num_q_heads=513") for r in rows)  # modular, SM100
    assert time.monotonic() - t0 < 120  # seconds on a loaded 2-core machine; a planner that walks more would hang
