"""A continuous-batching server's decode batches, simulated: the per-slot KV lengths a decode kernel sees step after
step, as requests arrive, grow by one key per generated token and leave. Pure Python, deterministic from a seed.

The server has ``slots`` decode slots (a CUDA graph's batch bucket). A request brings a prompt of ``P`` tokens and
generates ``O >= 1`` tokens, one per decode step; at its ``j``-th decode step (``j = 1 .. O``) its KV length is
``P + j``: the prompt's keys and one per token generated so far, the token being decoded included (paged decode
kernels write the new token's key before attention reads it). After its ``O``-th step it leaves, and its slot is
free for the next step. A free slot with no request has length 0 (the padding a server adds up to its bucket).

Arrivals, two ways (``arrival``):

* ``"full"``: a closed loop; a freed slot is refilled at once with a fresh request (a server with a queue that never
  empties: the regime a decode bucket is captured for). Every slot is live at every step.
* ``"poisson"``: an open loop; ``rate`` requests arrive per decode step, a Poisson process (counts per step drawn
  Poisson(rate)), wait in a FIFO queue and take free slots in order of arrival (lowest free slot first). Slots may
  be empty (length 0).

The first step (``start``): ``"steady"`` (``"full"`` only) starts in the closed loop's stationary state, so step 0 is
already a steady-state batch: each slot's request is the one a renewal process has in progress at a random time, its
output length drawn length-biased (in proportion to ``O``) and its step ``j`` uniform on ``1 .. O`` (renewal
theory's equilibrium; exact here, drawn by rejection, see ``_draw_in_progress``). ``"empty"``: every slot empty
before step 0 (a cold start: ``"full"`` fills them all with fresh requests at step 0).

Lengths (``PROFILES``): prompt and output lengths drawn independently, each ``ceil`` of a log-normal variable with
the profile's median and log-space standard deviation. The medians and means come from published serving traces,
each cited on its profile; what a source does not give is an assumption, labelled as one:

* ``chat`` and ``code``: the Azure LLM inference trace 2023 (two Azure services, 11 Nov 2023), as Patel et al.,
  "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024, section III-A (Fig. 3)
  summarise it: conversation, median prompt 1020 tokens and median output 129 tokens ("an almost bimodal
  distribution"); coding, median prompt 1500 tokens and median output 13 tokens. Trace: github.com/Azure/
  AzurePublicDataset, ``AzureLLMInferenceDataset2023.md``.
* ``mooncake``: Kimi's Mooncake trace (Qin et al., "Mooncake: A KVCache-centric Disaggregated Architecture for LLM
  Serving", FAST 2025, section 4.2): mean input 7,590 tokens, mean output 182 tokens (means, not medians: the
  log-normal's median is ``mean * exp(-sigma**2 / 2)``).

Assumptions (no source found here gives them): the log-space standard deviation ``ASSUMED_LOG_SIGMA`` (1.0) of every
length (the papers above report medians or means and plot the distributions, without a spread this module could
cite); the log-normal form (conversation outputs are bimodal in Splitwise's Fig. 3, which one log-normal does not
reproduce); prompt and output lengths independent. ShareGPT's lengths (Kwon et al., vLLM, SOSP 2023) and BurstGPT's
(Wang et al., 2024) are not profiles here: their parameters could not be read from a stored copy of the papers.

``scale`` multiplies every drawn length (the profile's shape at a smaller size, for interpreter runs); ``max_len``
caps a request's final KV length (``P + O <= max_len``: the prompt cut to ``max_len - 1`` tokens at most, the
output stopped at the limit, as a server's maximum model length does).

``snapshot`` is step 0 of a steady-state closed loop: the batch ``workloads.LENGTH_DISTS``' ``serving-*``
distributions scale to a batch's longest request.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from splitlab.errors import SplitlabError, check_choice, check_int

#: The log-space standard deviation of every length, an ASSUMPTION (see the module docstring): no stored source gave
#: a spread for the traces' prompt or output lengths.
ASSUMED_LOG_SIGMA = 1.0
ARRIVALS = ("full", "poisson")
STARTS = ("steady", "empty")


@dataclass(frozen=True)
class Profile:
    """A request-length distribution: prompt and output tokens, each ``ceil(LogNormal)`` with median
    ``*_median`` tokens and log-space standard deviation ``*_sigma``; ``source`` cites where the medians come from."""

    name: str
    prompt_median: float
    output_median: float
    prompt_sigma: float
    output_sigma: float
    source: str


def _median_of_mean(mean: float, sigma: float) -> float:
    """The median of a log-normal of mean ``mean`` and log-space standard deviation ``sigma``."""
    return mean * math.exp(-sigma * sigma / 2)


_S = ASSUMED_LOG_SIGMA
#: The profiles, by name (sources and assumptions: the module docstring).
PROFILES: dict[str, Profile] = {
    "chat": Profile("chat", 1020, 129, _S, _S, "Azure LLM inference trace 2023, conversation: median prompt 1020, "
                    "median output 129 tokens (Patel et al., Splitwise, ISCA 2024, sec. III-A)"),
    "code": Profile("code", 1500, 13, _S, _S, "Azure LLM inference trace 2023, coding: median prompt 1500, median "
                    "output 13 tokens (Patel et al., Splitwise, ISCA 2024, sec. III-A)"),
    "mooncake": Profile("mooncake", _median_of_mean(7590, _S), _median_of_mean(182, _S), _S, _S,
                        "Mooncake trace (Kimi): mean input 7590, mean output 182 tokens (Qin et al., Mooncake, "
                        "FAST 2025, sec. 4.2)"),
}


@dataclass
class _Request:
    prompt: int
    output: int  # decode steps in all (tokens it generates), >= 1
    step: int  # decode steps done so far; its KV length at its next step is prompt + step + 1
    rid: int


class Server:
    """The simulated server (the module docstring). ``step()`` advances one decode step and returns the slots' KV
    lengths; ``requests`` the id of the request each slot decoded at that step (-1: empty); ``live`` the requests
    holding a slot after it; ``admitted`` / ``finished`` count requests that took a slot / left one; ``queued`` those
    waiting (``"poisson"``).

    ``profile``: a ``PROFILES`` name; ``slots`` >= 1; ``seed`` >= 0; ``arrival`` ``"full"`` or ``"poisson"`` (with
    ``rate`` > 0, requests per decode step); ``start`` ``"steady"`` (``"full"`` only; its default) or ``"empty"``
    (the default with ``"poisson"``); ``scale`` > 0 multiplies every drawn length; ``max_len`` >= 2 caps a
    request's KV length. Anything else is refused in one line (``SplitlabError``)."""

    def __init__(self, profile: str, slots: int, *, seed: int = 0, arrival: str = "full", rate: float | None = None,
                 start: str | None = None, scale: float = 1.0, max_len: int | None = None) -> None:
        self.profile = PROFILES[check_choice("profile", profile, PROFILES)]
        self.slots = check_int("slots", slots)
        self.seed = check_int("seed", seed, minimum=0)
        self.arrival = check_choice("arrival", arrival, ARRIVALS)
        if arrival == "poisson":
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 < rate < math.inf):
                raise SplitlabError(f"rate={rate!r} is not allowed; expected a finite number > 0 (requests per "
                                    "decode step) with arrival='poisson'")
        elif rate is not None:
            raise SplitlabError(f"rate={rate!r} is not allowed with arrival='full'; expected None (a freed slot is "
                                "refilled at once)")
        start = ("steady" if arrival == "full" else "empty") if start is None else start
        self.start = check_choice("start", start, STARTS)
        if start == "steady" and arrival != "full":
            raise SplitlabError("start='steady' is not allowed with arrival='poisson'; expected start='empty' (the "
                                "steady state is drawn in closed form for the closed loop only)")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
            raise SplitlabError(f"scale={scale!r} is not allowed; expected a finite number > 0")
        self.scale = float(scale)
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=2)
        self.rate = rate
        self._rng = random.Random(f"{self.profile.name}:{self.seed}")  # a stream per profile (str seeds: sha512)
        self._queue: deque[_Request] = deque()
        self._next_id = 0
        self.admitted = self.finished = 0
        self._slots: list[_Request | None] = [None] * self.slots
        if self.start == "steady":
            self._slots = [self._draw_in_progress() for _ in range(self.slots)]
            self.admitted = self.slots
        self._ids = self._slot_ids()

    def _slot_ids(self) -> tuple[int, ...]:
        return tuple(-1 if r is None else r.rid for r in self._slots)

    # --- drawing requests ---------------------------------------------------------------------------------------
    def _lognormal(self, median: float, sigma: float) -> float:
        return self._rng.lognormvariate(math.log(median * self.scale), sigma)

    def _cap(self, prompt: int, output: int) -> tuple[int, int]:
        if self.max_len is None:
            return prompt, output
        prompt = min(prompt, self.max_len - 1)
        return prompt, min(output, self.max_len - prompt)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _draw(self) -> _Request:
        """A fresh request: prompt and output ``ceil`` of their log-normals (>= 1), capped by ``max_len``."""
        p = self.profile
        prompt = math.ceil(self._lognormal(p.prompt_median, p.prompt_sigma))
        output = math.ceil(self._lognormal(p.output_median, p.output_sigma))
        prompt, output = self._cap(prompt, output)
        return _Request(prompt, output, 0, self._new_id())

    def _draw_in_progress(self) -> _Request:
        """The request a slot of the steady closed loop holds at a random step: (prompt, output) with probability
        proportional to ``f(prompt) f(output) * O`` (``O`` the output after the cap: a slot spends ``O`` steps on
        it), and its step uniform on ``1 .. O``.

        Drawn exactly by rejection: the proposal draws the prompt from its law and the output's log-normal variable
        ``x`` from the mixture of its law and its length-biased law (``LogNormal(mu + sigma**2, sigma)``, weights
        ``1 : E[x]``: density proportional to ``(1 + x) f(x)``), accepted with probability ``O / (1 + x)``. That is
        at most 1 because ``O <= ceil(x) < 1 + x``, and at least ``1 / 2`` when the cap does not bind."""
        p = self.profile
        mu = math.log(p.output_median * self.scale)
        s = p.output_sigma
        mean = math.exp(mu + s * s / 2)
        biased = mean / (1 + mean)
        while True:
            prompt = math.ceil(self._lognormal(p.prompt_median, p.prompt_sigma))
            x = self._rng.lognormvariate(mu + s * s if self._rng.random() < biased else mu, s)
            prompt, output = self._cap(prompt, math.ceil(x))
            if self._rng.random() * (1 + x) < output:
                done = self._rng.randrange(output)  # steps done before this one: uniform on 0 .. O-1
                return _Request(prompt, output, done, self._new_id())

    def _arrivals(self) -> int:
        """Poisson(rate) by Knuth's product of uniforms, in pieces of rate at most 30 (no underflow)."""
        n, left = 0, float(self.rate)
        while left > 0:
            piece = min(left, 30.0)
            left -= piece
            limit, prod = math.exp(-piece), self._rng.random()
            while prod > limit:
                n += 1
                prod *= self._rng.random()
        return n

    # --- stepping -----------------------------------------------------------------------------------------------
    @property
    def requests(self) -> tuple[int, ...]:
        """Each slot's request id at the last step (-1: empty), aligned with the lengths it returned (a request
        that finished at that step included); before the first step, the starting state's."""
        return self._ids

    @property
    def live(self) -> int:
        """Requests holding a slot now (after the last step: those that finished at it have left)."""
        return sum(r is not None for r in self._slots)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def lengths(self) -> tuple[int, ...]:
        """The KV length each slot's request attends at its next step (0: empty), without stepping."""
        return tuple(0 if r is None else r.prompt + r.step + 1 for r in self._slots)

    def step(self) -> tuple[int, ...]:
        """One decode step: free slots filled (arrivals first), then every live request decodes one token; returns
        the KV lengths it attended, per slot (0: empty). Requests whose last token this was leave afterwards."""
        if self.arrival == "poisson":
            for _ in range(self._arrivals()):
                self._queue.append(self._draw())
        for i, r in enumerate(self._slots):
            if r is None:
                nxt = self._draw() if self.arrival == "full" else (self._queue.popleft() if self._queue else None)
                if nxt is not None:
                    self._slots[i] = nxt
                    self.admitted += 1
        out = self.lengths()
        self._ids = self._slot_ids()
        for i, r in enumerate(self._slots):
            if r is not None:
                r.step += 1
                if r.step == r.output:
                    self._slots[i] = None
                    self.finished += 1
        return out


def steps(profile: str, slots: int, count: int, **kwargs) -> Iterator[tuple[int, ...]]:
    """The per-slot KV lengths of ``count`` consecutive decode steps of a ``Server(profile, slots, **kwargs)``."""
    count = check_int("count", count, minimum=0)
    server = Server(profile, slots, **kwargs)
    for _ in range(count):
        yield server.step()


def snapshot(profile: str, slots: int, seed: int) -> tuple[int, ...]:
    """Step 0 of a steady-state closed loop (``arrival="full"``, ``start="steady"``): every slot's KV length, in the
    profile's own token counts."""
    return Server(profile, slots, seed=seed).lengths()
