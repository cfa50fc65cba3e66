"""Decode workloads: the shape of one decode call, named as the result columns are.

``DecodeWorkload(**row)`` rebuilds a workload from the workload columns of a result row, so the
planners can be asked, after the fact, what they would have picked for a measured point.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property

from splitlab import families, serving
from splitlab.errors import SplitlabError, check_choice, check_int

#: The kinds of workload, one per kernel family (``splitlab.families``).
KINDS = families.kinds()
#: splitlab's own decode kernels, by the name their sweeps record (the ``kernel`` column, the card's name), and the
#: kind of workload each runs: what the fit, its scores and the fitted range read of a result set (a view of
#: ``splitlab.families``).
KERNEL_KINDS = {f.name: f.kind for f in families.ALL}
DTYPES = ("bf16", "fp16", "fp32", "fp8_e4m3")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1}

#: The largest value ``DecodeWorkload`` accepts for each integer field (the smallest is 1; 0 for ``topk``).
#: Well past any decode call splitlab models (the shipped cards reach batch 256, 128 heads, head dim 576,
#: 131072 keys, top-k 2048), and small enough that every planner answers at once: the per-request planners
#: walk the batch (a few hundredths of a second each at 65536), so a batch of 10**12 would not fit in memory.
#: ``ctx_len`` (keys per request, or sparse MLA's token pool) stops where int32 indices do.
LIMITS: dict[str, int] = dict(batch=1 << 16, num_q_heads=4096, num_kv_heads=4096, head_dim_qk=1024,
                              head_dim_v=1024, ctx_len=(1 << 31) - 1, page_size=1 << 16, topk=1 << 20)

#: Named length distributions of a batch (``DecodeWorkload.length_dist``) and their spread ``N`` (no request shorter
#: than ``ceil(longest / N)``), or None for
#: ``uniform`` (every request the longest: the default, and every batch swept before ragged batches existed).
#: ``spreadN``: each request's length drawn uniformly from the integers in ``[ceil(longest / N), longest]``, then
#: one request (drawn too) set to exactly the longest. ``longtail``: seven requests in eight drawn from ``[longest /
#: 64, longest / 8]``, one in eight (every eighth, from a drawn offset) exactly the longest: a server's batch of
#: short chats beside a few long documents. ``bimodal``: half the requests (drawn) from ``[longest / 16, longest /
#: 8]``, the other half from ``[longest / 2, longest]``, one set to the longest. ``serving-PROFILE``: a continuous-
#: batching server's batch at steady state (``serving.snapshot``: every slot's request in progress, its prompt and
#: output lengths from ``serving.PROFILES[PROFILE]``, a published trace's), scaled so that its longest is exactly
#: ``longest`` (rounded; any below ``ceil(longest / SERVING_SPREAD)`` raised to it).
LENGTH_DISTS: dict[str, int | None] = {"uniform": None, "spread4": 4, "spread8": 8, "spread16": 16, "spread64": 64,
                                       "longtail": 64, "bimodal": 16}
#: The floor of the ``serving-*`` distributions: no request shorter than ``longest / SERVING_SPREAD``.
SERVING_SPREAD = 256
LENGTH_DISTS.update({f"serving-{name}": SERVING_SPREAD for name in serving.PROFILES})
UNIFORM = "uniform"
#: The largest ``length_seed``.
MAX_LENGTH_SEED = (1 << 31) - 1


def draw_lengths(dist: str, seed: int, batch: int, longest: int) -> tuple[int, ...]:
    """The per-request lengths of a batch of ``batch`` drawn from the named distribution ``dist`` with ``seed``
    (``LENGTH_DISTS``): the same tuple on every machine and Python (``random.Random`` seeded with an int). The
    longest is exactly ``longest``."""
    spread = LENGTH_DISTS[check_choice("length_dist", dist, LENGTH_DISTS)]
    if spread is None:
        return (longest,) * batch
    lo = max(1, -(-longest // spread))
    if dist.startswith("serving-"):
        lens = serving.snapshot(dist.removeprefix("serving-"), batch, seed)
        top = max(lens)
        return tuple(max(lo, (n * longest + top // 2) // top) for n in lens)
    rng = random.Random(seed)
    if dist == "longtail":
        first = rng.randrange(8)
        lens = [longest if i % 8 == first else rng.randint(lo, max(lo, longest // 8)) for i in range(batch)]
    elif dist == "bimodal":
        lens = [rng.randint(lo, max(lo, longest // 8)) if rng.random() < 0.5
                else rng.randint(max(lo, longest // 2), longest) for _ in range(batch)]
    else:
        lens = [rng.randint(lo, longest) for _ in range(batch)]
    lens[rng.randrange(batch)] = longest
    return tuple(lens)


@dataclass(frozen=True)
class DecodeWorkload:
    """One decode call.

    kind        ``gqa`` (paged GQA/MHA/MQA), ``mla`` (absorbed MLA over a latent cache, one kv head),
                ``sparse_mla`` (top-k gather from a token pool).
    batch       requests (``gqa``, ``mla``) or query tokens (``sparse_mla``).
    ctx_len     keys per request: the maximum when ``seq_lens`` is given; for ``sparse_mla`` the
                token-pool size the indices point into.
    seq_lens    optional per-request key counts (ragged batches); ``max(seq_lens) == ctx_len``. ``sparse_mla``:
                each token's walked top-k positions (its valid prefix), each at most ``topk``.
    length_dist a named length distribution (``LENGTH_DISTS``) the batch's lengths are drawn from with
                ``length_seed`` (ragged batches a sweep can name and a result row can rebuild): ``uniform`` (the
                default) or ``spreadN``, each request's keys (``sparse_mla``: each token's valid top-k, the rest
                of its row -1) uniform on ``[ceil(L / N), L]`` with ``L`` = ``ctx_len`` (``topk``), one exactly
                ``L``. Not with ``seq_lens``. ``uniform`` has no seed: ``length_seed`` is set to 0.
    length_seed the seed of ``length_dist``'s draw.
    page_size   tokens per KV page (paged kinds).
    topk        candidates per query token (``sparse_mla``; 0 otherwise).

    Every integer field is at least 1 (``topk`` 0 outside ``sparse_mla``) and at most ``LIMITS[field]``;
    anything else raises ``SplitlabError`` naming the field and the range.

    The planners see one length per batch: ``ctx_len`` (``topk``), the longest request, as ``keys_per_request``;
    the ported rules that walk the batch read ``lengths``; no rule here models each request's cost.
    """

    kind: str
    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    ctx_len: int
    page_size: int = 16
    topk: int = 0
    dtype: str = "bf16"
    seq_lens: tuple[int, ...] | None = None
    length_dist: str = UNIFORM
    length_seed: int = 0

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_choice("dtype", self.dtype, DTYPES)
        for name in ("batch", "num_q_heads", "num_kv_heads", "head_dim_qk", "head_dim_v", "ctx_len",
                     "page_size"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), maximum=LIMITS[name]))
        object.__setattr__(self, "topk", check_int("topk", self.topk, minimum=0, maximum=LIMITS["topk"]))
        if self.kind != "sparse_mla" and self.topk:
            raise SplitlabError(f"topk={self.topk} is not allowed for kind={self.kind!r}; expected 0 (top-k "
                                "candidates are sparse MLA's)")
        if self.num_q_heads % self.num_kv_heads:
            raise SplitlabError(
                f"num_q_heads={self.num_q_heads} is not allowed with num_kv_heads={self.num_kv_heads}; "
                "expected a multiple of num_kv_heads")
        if self.kind in ("mla", "sparse_mla") and self.num_kv_heads != 1:
            raise SplitlabError(f"num_kv_heads={self.num_kv_heads} is not allowed for kind={self.kind!r}; "
                                "expected 1 (one latent head)")
        if self.head_dim_v > self.head_dim_qk and self.kind != "gqa":
            raise SplitlabError(f"head_dim_v={self.head_dim_v} is not allowed; expected <= head_dim_qk "
                                f"({self.head_dim_qk}): V is the first columns of the latent")
        if self.kind == "sparse_mla" and self.topk < 1:
            raise SplitlabError(f"topk={self.topk} is not allowed for kind='sparse_mla'; expected >= 1")
        if self.seq_lens is not None:
            if len(self.seq_lens) != self.batch:
                raise SplitlabError(f"seq_lens has {len(self.seq_lens)} entries; expected batch={self.batch}")
            lens = tuple(check_int("seq_lens[i]", n, minimum=0) for n in self.seq_lens)
            if self.kind == "sparse_mla":
                if max(lens) > self.topk:
                    raise SplitlabError(f"seq_lens has a token walking {max(lens)} positions; expected at most "
                                        f"topk={self.topk} (sparse_mla: each token's walked top-k)")
            elif max(lens) != self.ctx_len:
                raise SplitlabError(f"ctx_len={self.ctx_len} is not allowed with seq_lens; expected "
                                    f"max(seq_lens)={max(lens)}")
            object.__setattr__(self, "seq_lens", lens)
        check_choice("length_dist", self.length_dist, LENGTH_DISTS)
        object.__setattr__(self, "length_seed", check_int("length_seed", self.length_seed, minimum=0,
                                                          maximum=MAX_LENGTH_SEED))
        if self.length_dist == UNIFORM:
            object.__setattr__(self, "length_seed", 0)
        elif self.seq_lens is not None:
            raise SplitlabError(f"length_dist={self.length_dist!r} is not allowed with seq_lens; expected one of "
                                "them (seq_lens gives the lengths, length_dist draws them)")

    # --- derived facts -------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.num_q_heads // self.num_kv_heads

    @cached_property  # drawn once per workload: the planners read the lengths often
    def lengths(self) -> tuple[int, ...]:
        """Keys attended per request (sparse: valid top-k entries per token, the rest of its row -1): ``seq_lens``,
        or drawn from ``length_dist`` with ``length_seed`` (``draw_lengths``), or the longest for every one."""
        if self.seq_lens is not None:
            return self.seq_lens
        return draw_lengths(self.length_dist, self.length_seed, self.batch,
                            self.topk if self.kind == "sparse_mla" else self.ctx_len)

    @property
    def ragged(self) -> bool:
        """Whether the lengths are drawn from a distribution other than ``uniform``."""
        return self.length_dist != UNIFORM

    @property
    def keys_per_request(self) -> int:
        """The longest request's key count: what a planner sees as ``num_keys`` / ``max_seqlen_k``."""
        return max(self.lengths)

    @property
    def key_bytes(self) -> int:
        """Bytes of one key of one kv head: its K and V rows (GQA), or its one latent row, which serves as K
        and V (MLA, sparse MLA)."""
        elt = DTYPE_BYTES[self.dtype]
        return (self.head_dim_qk + self.head_dim_v) * elt if self.kind == "gqa" else self.head_dim_qk * elt

    @property
    def kv_bytes(self) -> int:
        """Unique KV bytes one call must read (sparse: the gathered rows, counted once per token)."""
        return sum(self.lengths) * self.num_kv_heads * self.key_bytes

    @property
    def flops(self) -> int:
        """Matrix FLOPs: 2*Dqk per q.k product plus 2*Dv per p.v product, per (query head, key)."""
        return 2 * sum(self.lengths) * self.num_q_heads * (self.head_dim_qk + self.head_dim_v)

    def row(self) -> dict:
        """The workload columns of a result row (``DecodeWorkload(**w.row()) == w``)."""
        return asdict(self)

    def with_(self, **changes) -> DecodeWorkload:
        """A copy with some fields changed (``w.with_(batch=8, ctx_len=8192)``)."""
        if "ctx_len" in changes and "seq_lens" not in changes:
            changes["seq_lens"] = None
        return replace(self, **changes)


FIELDS = tuple(f.name for f in fields(DecodeWorkload))


def length_columns(w: DecodeWorkload) -> dict[str, float | int]:
    """The result columns that summarise a batch's lengths: ``ctx_mean`` and ``ctx_max``, the mean and the
    longest of ``w.lengths`` (keys per request; sparse MLA: valid top-k per token)."""
    lens = w.lengths
    return {"ctx_mean": sum(lens) / len(lens), "ctx_max": max(lens)}


def floor_time_us(w: DecodeWorkload, read_gbps: float, tflops: float) -> float:
    """Roofline floor: ``max(unique bytes / bandwidth, FLOPs / matrix rate)``, in microseconds."""
    return max(w.kv_bytes / (read_gbps * 1e3), w.flops / (tflops * 1e6))


# Model presets: decode attention of one layer, per GPU (heads already divided by tensor parallelism).
# (kind, num_q_heads, num_kv_heads, head_dim_qk, head_dim_v, topk, source)
_MODELS: dict[str, tuple[str, int, int, int, int, int, str]] = {
    "llama-3-8b": ("gqa", 32, 8, 128, 128, 0, "Meta Llama 3 8B config: 32 heads, 8 kv heads, head dim 128"),
    "llama-3-70b": ("gqa", 64, 8, 128, 128, 0, "Meta Llama 3 70B config: 64 heads, 8 kv heads, head dim 128"),
    "qwen3-32b": ("gqa", 64, 8, 128, 128, 0, "Qwen3-32B config: 64 heads, 8 kv heads, head dim 128"),
    "mqa-128": ("gqa", 128, 1, 128, 128, 0, "single-kv-head MHA/MQA, 128 query heads (absorbed-MLA-like)"),
    "deepseek-v3-mla": ("mla", 128, 1, 576, 512, 0,
                        "DeepSeek-V3 absorbed MLA at TP1: 128 heads, latent 512 + rope 64 = 576, V 512"),
    "deepseek-v3-mla-tp8": ("mla", 16, 1, 576, 512, 0, "DeepSeek-V3 absorbed MLA at TP8: 128 / 8 = 16 heads"),
    "kimi-k2.5-mla-tp4": ("mla", 16, 1, 576, 512, 0, "Kimi-K2.5 absorbed MLA at TP4: 64 / 4 = 16 heads "
                          "(seed 000's 'MLA num_heads <= 16' case)"),
    "deepseek-v3.2-sparse-mla": ("sparse_mla", 128, 1, 576, 512, 2048,
                                 "DeepSeek-V3.2 sparse attention: 128 heads, 576/512, top-k 2048"),
    "deepseek-v4-sparse-mla": ("sparse_mla", 64, 1, 512, 512, 2048,
                               "DeepSeek-V4-style sparse MLA as in seed 003: 64 heads, head dim 512 "
                               "(448 NoPE + 64 RoPE), top-k 2048"),
}


def names() -> list[str]:
    """Model preset names."""
    return list(_MODELS)


def describe(name: str) -> str:
    """The source line of a model preset."""
    return _MODELS[_key(name)][-1]


def _key(name: str) -> str:
    key = str(name).strip().lower()
    if key not in _MODELS:
        raise SplitlabError(f"workload={name!r} is not allowed; expected one of {', '.join(_MODELS)}")
    return key


def get(name: str, *, batch: int = 1, ctx_len: int = 8192, page_size: int | None = None,
        dtype: str = "bf16", topk: int | None = None) -> DecodeWorkload:
    """A model preset at one batch and context (``get("llama-3-8b", batch=4, ctx_len=32768)``).

    For ``sparse_mla`` presets ``batch`` counts query tokens and ``ctx_len`` the token pool.
    """
    kind, hq, hkv, dqk, dv, preset_topk, _ = _MODELS[_key(name)]
    if page_size is None:
        page_size = families.by_kind(kind).page_size
    return DecodeWorkload(kind=kind, batch=batch, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
                          head_dim_v=dv, ctx_len=ctx_len, page_size=page_size,
                          topk=preset_topk if topk is None else topk, dtype=dtype)


def arithmetic_intensity(w: DecodeWorkload) -> float:
    """FLOPs per unique KV byte."""
    return w.flops / w.kv_bytes if w.kv_bytes else math.inf
