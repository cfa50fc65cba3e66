"""The continuous-batching simulation (``splitlab.serving``) and the ``serving-*`` length distributions it gives
``workloads.LENGTH_DISTS``: deterministic from a seed, live requests grow one key a step, finished ones leave and
their slots refill (closed loop) or wait for a Poisson arrival (open loop), the steady start is the long run's state,
bad parameters are refused in one line."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from splitlab import serving
from splitlab.errors import SplitlabError
from splitlab.serving import Server
from splitlab.workloads import LENGTH_DISTS, SERVING_SPREAD, DecodeWorkload, draw_lengths


def run(server: Server, count: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``count`` steps of ``server``: (lengths, request ids) after each."""
    return [(server.step(), server.requests) for _ in range(count)]


@pytest.mark.parametrize("profile", list(serving.PROFILES))
def test_the_same_seed_gives_the_same_steps(profile):
    a = list(serving.steps(profile, 6, 40, seed=3, scale=0.1))
    assert a == list(serving.steps(profile, 6, 40, seed=3, scale=0.1)) and len(a) == 40
    assert a != list(serving.steps(profile, 6, 40, seed=4, scale=0.1))
    assert all(len(lens) == 6 and min(lens) >= 1 for lens in a)  # the closed loop: every slot live


@pytest.mark.parametrize("arrival,kw", [("full", {}), ("poisson", dict(rate=0.8))])
def test_live_requests_grow_one_key_a_step_and_finished_ones_leave(arrival, kw):
    s = Server("chat", 8, seed=1, arrival=arrival, scale=0.05, **kw)
    steps = run(s, 300)
    changes = 0
    for (before_lens, before_ids), (lens, ids) in itertools.pairwise(steps):
        for b in range(8):
            assert (lens[b] > 0) == (ids[b] != -1)  # a slot's length is its request's, 0 when empty
            if ids[b] != -1 and ids[b] == before_ids[b]:
                assert lens[b] == before_lens[b] + 1  # the same request: one key more
            changes += before_ids[b] != -1 and ids[b] != before_ids[b]
        if arrival == "full":
            assert -1 not in ids
    assert changes > 20  # requests left and others took their slots
    assert s.admitted - s.finished == s.live
    ids = [i for _, step_ids in steps for i in step_ids if i != -1]
    assert len(set(ids)) == s.admitted  # ids are never reused: one per admitted request
    if arrival == "poisson":
        assert any(-1 in step_ids for _, step_ids in steps)


def test_a_request_leaves_after_its_last_step():
    """A request decodes consecutive steps in one slot, then its slot holds another request (or none) for good."""
    s = Server("code", 4, seed=2, arrival="poisson", rate=0.3, scale=0.2)
    where: dict[int, list[tuple[int, int]]] = {}
    for t, (_, ids) in enumerate(run(s, 300)):
        for b, i in enumerate(ids):
            if i != -1:
                where.setdefault(i, []).append((t, b))
    for spans in where.values():
        assert len({b for _, b in spans}) == 1  # one slot
        ts = [t for t, _ in spans]
        assert ts == list(range(ts[0], ts[0] + len(ts)))  # consecutive steps


def test_poisson_arrivals_queue_in_order_and_the_rate_counts():
    lo = Server("chat", 4, seed=5, arrival="poisson", rate=0.02, scale=0.05)
    lo_lens = [lo.step() for _ in range(400)]
    assert any(0 in lens for lens in lo_lens) and lo.queued == 0  # a light load leaves slots empty
    hi = Server("chat", 4, seed=5, arrival="poisson", rate=3.0, scale=0.05)
    admitted = []
    for _ in range(200):
        before = set(hi.requests)
        hi.step()
        admitted += sorted(set(hi.requests) - before - {-1})
    assert hi.queued > 100  # arrivals outpace four slots: the queue grows
    assert admitted == sorted(admitted)  # FIFO: ids are given at arrival
    # about rate x steps arrivals in all (Poisson: sd sqrt(600) ~ 25)
    assert abs(hi.admitted + hi.queued - 600) < 100


def test_the_steady_start_is_the_long_runs_state():
    """The closed loop started cold (every slot a fresh request at step 0) and run past its longest requests: its
    slots' lengths have the mean and quartiles of the steady start's step 0 (drawn in closed form); the cold step 0
    does not (it lacks the output progress)."""
    kw = dict(scale=0.1, max_len=4000)
    cold = Server("chat", 3000, seed=7, start="empty", **kw)
    first = cold.step()
    for _ in range(800):
        late = cold.step()
    steady = Server("chat", 3000, seed=8, **kw).lengths()
    for f in (statistics.mean, statistics.median, lambda x: statistics.quantiles(x, n=4)[2]):
        assert f(late) == pytest.approx(f(steady), rel=0.08)
    assert statistics.mean(first) != pytest.approx(statistics.mean(steady), rel=0.08)  # the tolerance tells them apart


def test_max_len_caps_every_length():
    for arrival, kw in (("full", {}), ("poisson", dict(rate=2.0))):
        s = Server("mooncake", 16, seed=0, arrival=arrival, max_len=300, **kw)
        assert max(max(s.step()) for _ in range(400)) <= 300


@pytest.mark.parametrize("kw,word", [
    (dict(profile="sharegpt"), "profile='sharegpt' is not allowed"),
    (dict(slots=0), "slots=0 is not allowed"),
    (dict(seed=-1), "seed=-1 is not allowed"),
    (dict(arrival="burst"), "arrival='burst' is not allowed"),
    (dict(rate=1.0), "rate=1.0 is not allowed with arrival='full'"),
    (dict(arrival="poisson"), "rate=None is not allowed"),
    (dict(arrival="poisson", rate=math.nan), "rate=nan is not allowed"),
    (dict(arrival="poisson", rate=-2), "rate=-2 is not allowed"),
    (dict(arrival="poisson", rate=True), "rate=True is not allowed"),
    (dict(arrival="poisson", rate=1.0, start="steady"), "start='steady' is not allowed"),
    (dict(start="warm"), "start='warm' is not allowed"),
    (dict(scale=0), "scale=0 is not allowed"),
    (dict(scale=math.inf), "scale=inf is not allowed"),
    (dict(max_len=1), "max_len=1 is not allowed"),
])
def test_bad_parameters_are_refused_in_one_line(kw, word):
    args = dict(profile="chat", slots=4) | kw
    with pytest.raises(SplitlabError, match=word) as e:
        Server(args.pop("profile"), args.pop("slots"), **args)
    assert "\n" not in str(e.value)


def test_every_profile_cites_its_source_and_the_assumed_spread_is_labelled():
    for p in serving.PROFILES.values():
        assert p.source and p.prompt_median > 0 and p.output_median > 0
        assert p.prompt_sigma == p.output_sigma == serving.ASSUMED_LOG_SIGMA
    assert "ASSUMPTION" in serving.__doc__.upper()


# --- the named distributions -----------------------------------------------------------------------------------

SERVING = [d for d in LENGTH_DISTS if d.startswith("serving-")]


def test_each_profile_is_a_named_distribution():
    assert SERVING == [f"serving-{p}" for p in serving.PROFILES]


@pytest.mark.parametrize("dist", SERVING)
def test_a_serving_batch_is_the_snapshot_scaled_to_the_longest(dist):
    profile = dist.removeprefix("serving-")
    raw = serving.snapshot(profile, 32, 9)
    lens = draw_lengths(dist, 9, 32, 20_000)
    assert max(lens) == 20_000 and min(lens) >= math.ceil(20_000 / SERVING_SPREAD)
    top = max(raw)
    for n, m in zip(raw, lens, strict=True):
        assert m == max(math.ceil(20_000 / SERVING_SPREAD), round(n * 20_000 / top))
    w = DecodeWorkload("gqa", 32, 8, 2, 16, 16, 20_000, length_dist=dist, length_seed=9)
    assert w.lengths == lens and DecodeWorkload(**w.row()) == w
