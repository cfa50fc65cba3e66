"""The split-K buffers of the experimental GQA launchers here (``gqa_tma.py``, ``gqa_ws_gluon.py``,
``gqa_wsplit.py``), as ``splitlab.kernels.gqa.gqa_decode`` allocates them, and the shipped merge."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splitlab.kernels.combine import launch_combine


@dataclass
class Partials:
    """Where a partial kernel writes: with one split the output and lse themselves (split stride 0), else fp32
    partials [B, Hq, S, D] and [B, Hq, S] for the merge."""

    out: torch.Tensor  # the partial kernel's destination
    lse: torch.Tensor
    final_lse: torch.Tensor
    num_splits: int

    @property
    def out_strides(self) -> tuple[int, int, int, int]:
        """(b, h, split, d) strides of ``out``."""
        if self.num_splits == 1:
            return self.out.stride(0), self.out.stride(1), 0, self.out.stride(2)
        return tuple(self.out.stride())

    @property
    def lse_strides(self) -> tuple[int, int, int]:
        """(b, h, split) strides of ``lse``."""
        return (*self.lse.stride()[:2], 0) if self.num_splits == 1 else tuple(self.lse.stride())

    def merged(self, dtype: torch.dtype, return_lse: bool):
        """The decode's output (merged by the shipped combine when split), and its lse with ``return_lse``."""
        out = self.out
        if self.num_splits > 1:
            out = torch.empty(out.shape[0], out.shape[1], out.shape[3], dtype=dtype, device=out.device)
            launch_combine(self.out, self.lse, out, self.final_lse)
        return (out, self.final_lse) if return_lse else out


def partials(q: torch.Tensor, num_splits: int) -> Partials:
    """The buffers for ``q`` [B, Hq, D] at ``num_splits``."""
    B, Hq, D = q.shape
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    if num_splits == 1:
        return Partials(torch.empty(B, Hq, D, dtype=q.dtype, device=q.device), lse, lse, 1)
    return Partials(torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device),
                    torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device), lse, num_splits)
