"""An external implementation swept by splitlab: a split-K paged GQA decode in plain PyTorch (it runs on a CPU, so
CI can sweep it with the fake timer). ``examples/my_kernel.toml`` is its card; a card may live anywhere on disk and
names the launcher by import path (``my_kernel:decode``), which resolves once this folder is on the import path:
``--plugin examples/my_kernel.py`` (or any plugin file of this folder) puts it there.

``decode`` takes the arguments of ``splitlab.kernels.gqa.gqa_decode`` (the sweep draws them with
``splitlab.kernels.inputs.workload_inputs`` and checks the output against ``splitlab.kernels.reference``), splits
each request's keys into ``num_splits`` parts, attends to each part and merges the partial results by their
log-sum-exp; ``launch_facts`` says what a launch would be (its split count and programs) without running it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch


def launch_facts(w, *, num_splits=None, device=None):
    """The resolved knobs and CTAs of a call: one program per (request, KV head, split)."""
    s = 1 if num_splits is None else int(num_splits)
    return SimpleNamespace(num_splits=s, ctas=w.batch * w.num_kv_heads * s)


def decode(q, k_cache, v_cache, block_table, seq_lens, *, num_splits=None, sm_scale=None, return_lse=False):
    """Paged GQA decode, split-K: q [B, Hq, D]; caches [pages, page_size, Hkv, D]; out [B, Hq, Dv] in q's dtype."""
    s = 1 if num_splits is None else int(num_splits)
    if s < 1:
        raise ValueError(f"num_splits={num_splits!r} is not allowed; expected an integer >= 1")
    B, Hq, D = q.shape
    page, Hkv, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    out = torch.zeros(B, Hq, Dv, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        pages = block_table[b, : -(-n // page)].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:n].float().repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
        v = v_cache[pages].reshape(-1, Hkv, Dv)[:n].float().repeat_interleave(Hq // Hkv, dim=1)
        qb = q[b].float() * scale
        for part in torch.arange(n).tensor_split(s):  # an empty part (more splits than keys) adds nothing
            if len(part) == 0:
                continue
            logits = torch.einsum("hd,nhd->hn", qb, k[part])
            part_lse = torch.logsumexp(logits, dim=-1)
            part_out = torch.einsum("hn,nhd->hd", torch.softmax(logits, dim=-1), v[part])
            new_lse = torch.logaddexp(lse[b], part_lse)
            out[b] = out[b] * torch.exp(lse[b] - new_lse)[:, None] + part_out * torch.exp(part_lse - new_lse)[:, None]
            lse[b] = new_lse
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
