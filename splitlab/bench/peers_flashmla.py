"""FlashMLA's dense MLA decode (DeepSeek, ``deepseek-ai/FlashMLA``) as a sweep implementation (kernel card of
type "external"), on splitlab's own paged latent cache.

``FLASHMLA_DECODE`` calls ``flash_mla.flash_mla_with_kvcache`` (bf16, sm_90) on splitlab's ``q [B, H, 576]``
(viewed ``[B, 1, H, 576]``: one query token), latent cache ``[num_pages, 64, 576]`` (viewed ``[.., 64, 1, 576]``:
one kv head), block table and lengths, with ``head_dim_v = 512`` and FlashMLA's default scale ``576 ** -0.5``
(the reference's). No knob: FlashMLA's scheduler (``get_mla_metadata``; filled by the first call of a shape and
reused for the rest, as upstream documents) picks its own splits. Its page size is 64.

FlashMLA ships as source only: build it for sm_90a from ``deepseek-ai/FlashMLA`` (``pip install
--no-build-isolation .`` in a checkout with its CUTLASS submodule) so that ``import flash_mla`` works; it is
imported only where a point runs. Its sparse decode reads an FP8 cache in DeepSeek-V3.2's own layout (656 bytes a
token), not splitlab's bf16 pool, so it is not a peer of ``sparse_mla_decode`` and is not timed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from splitlab.bench.peers import gpu_missing, library_missing
from splitlab.devices import DeviceSpec
from splitlab.errors import SplitlabError, bad
from splitlab.workloads import DecodeWorkload

LIBRARY = "flash_mla"
INSTALL_HINT = "build deepseek-ai/FlashMLA from source for sm_90a (see kernels/flashmla_decode.toml)"
PAGE_SIZE = 64  # FlashMLA's page block size
HEAD_DIM_QK, HEAD_DIM_V = 576, 512
NEEDS_ARCH = (9, 0)


def load_kit(folder: str) -> None:
    """Build FlashMLA from a prebuilt kit in ``folder`` (its ``fmla_peer.py`` build script, as the H200 workplace
    carries it) and register it as ``flash_mla``, for the experiments that time it beside splitlab."""
    import sys

    sys.path.insert(0, folder)
    import fmla_peer  # the kit's build script

    mod, _, _ = fmla_peer.build(from_source=False, sparse=False)
    fmla_peer.import_flash_mla(mod)


class FlashMLADecode:
    """FlashMLA's dense decode (see the module docstring); no knobs."""

    knobs: tuple[str, ...] = ()
    kinds = ("mla",)
    label = "flashmla-decode"

    def __init__(self) -> None:
        self._sched: dict = {}

    def unavailable(self) -> str | None:
        return library_missing(LIBRARY, f"{self.label}: FlashMLA", INSTALL_HINT) or \
            gpu_missing(self.label, arch=NEEDS_ARCH)

    def launch_facts(self, w: DecodeWorkload, knobs: dict, device: DeviceSpec) -> None:
        if knobs:
            raise bad("knobs", sorted(knobs), f"none ({self.label} schedules its own splits)")
        if w.kind != "mla":
            raise bad("kind", w.kind, f"mla ({self.label})")
        if (w.head_dim_qk, w.head_dim_v) != (HEAD_DIM_QK, HEAD_DIM_V):
            raise SplitlabError(f"head_dim_qk={w.head_dim_qk}, head_dim_v={w.head_dim_v} is not allowed; expected "
                                f"{HEAD_DIM_QK}/{HEAD_DIM_V} ({self.label})")
        if w.page_size != PAGE_SIZE:
            raise bad("page_size", w.page_size, f"{PAGE_SIZE} ({self.label})")
        if w.dtype != "bf16":
            raise bad("dtype", w.dtype, f"bf16 ({self.label}: its fp8 path is the sparse V3.2 layout)")
        if min(w.lengths) < 1:
            raise bad("seq_lens", w.seq_lens, f"lengths >= 1 ({self.label})")
        return None

    def inputs(self, w: DecodeWorkload, *, device, seed: int) -> dict:
        from splitlab.kernels.inputs import workload_inputs

        if w.kind != "mla":
            raise bad("kind", w.kind, f"mla ({self.label})")
        return workload_inputs(w, device=device, seed=seed, draw_on="device")

    def reference(self, w: DecodeWorkload, inputs: dict):
        from splitlab.kernels import reference

        return reference.mla_decode(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"],
                                    head_dim_v=w.head_dim_v)

    def _meta(self, w: DecodeWorkload):
        """The shape's scheduling metadata: one per shape (every input set has the same lengths)."""
        import flash_mla

        if w not in self._sched:
            self._sched = {w: flash_mla.get_mla_metadata()[0]}
        return self._sched[w]

    def call(self, w: DecodeWorkload, inputs: dict, knobs: dict) -> Callable:
        sched = self._meta(w)
        q, kv, table, lens = inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"]

        def run():
            return decode(q, kv, table, lens, sched)

        return run


def decode(q, kv_cache, block_table, seq_lens, sched):
    """One ``flash_mla.flash_mla_with_kvcache`` call on splitlab's layout: q ``[B, H, 576]`` (viewed ``[B, 1, H,
    576]``: one query token), latent cache ``[num_pages, 64, 576]`` (viewed ``[.., 64, 1, 576]``: one kv head),
    ``HEAD_DIM_V`` output columns, scale ``576 ** -0.5``; returns out ``[B, H, 512]``. ``sched``: a
    ``flash_mla.get_mla_metadata()[0]``, filled by its first call (the scheduler kernel, on the device) and reused
    while the lengths stay the same; a fresh one inside a captured CUDA graph recomputes it at every replay."""
    import flash_mla

    out, _ = flash_mla.flash_mla_with_kvcache(q.unsqueeze(1), kv_cache.unsqueeze(2), block_table, seq_lens,
                                              HEAD_DIM_V, sched, None, softmax_scale=1.0 / math.sqrt(q.shape[-1]),
                                              causal=False)
    return out[:, 0]


FLASHMLA_DECODE = FlashMLADecode()
