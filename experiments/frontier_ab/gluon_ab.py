"""The Gluon 128-row tile (``gqa_wide_gluon.py``) against ``gqa_decode``'s tl kernel on MQA-128: fp64-reference checks,
then graph-replay timings. ``python experiments/frontier_ab/gluon_ab.py OUT.jsonl`` on an sm_90 GPU."""

import sys

import gqa_wide_gluon as wide
import torch
from ab import emit, floor_us, sets_for

from splitlab.bench.timing import time_graph
from splitlab.kernels import reference
from splitlab.kernels.accuracy import rel_err
from splitlab.kernels.gqa import gqa_decode
from splitlab.kernels.inputs import gqa_inputs

CHECKS = [  # (batch, query heads, kv heads, lengths, page size, splits): empty, short, odd and long requests
    (3, 128, 1, [1000, 0, 77], 16, 1), (3, 128, 1, [1000, 0, 77], 16, 4), (2, 128, 1, [5000, 4096], 64, 3),
    (4, 96, 1, [300, 129, 64, 1], 16, 2), (2, 128, 1, [64, 65], 16, 7), (1, 128, 1, [20000], 16, 1),
]
SHAPES = [(8, 8192), (16, 8192), (16, 32768), (32, 8192), (32, 65536), (64, 8192), (64, 32768), (128, 16384)]


def main(path: str) -> None:
    for batch, hq, hkv, lens, page, s in CHECKS:
        x = gqa_inputs(batch, hq, hkv, 128, lens, page_size=page, device="cuda", seed=3)
        ref = reference.gqa_decode(**x)
        out = wide.gqa_wide(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], s)
        tl = gqa_decode(**x, num_splits=s)
        emit(path, check=True, B=batch, hq=hq, lens=lens, page=page, s=s, err_wide=rel_err(out, ref),
             err_tl=rel_err(tl, ref), nan=bool(torch.isnan(out).any()))
    for batch, n in SHAPES:
        ins = [gqa_inputs(batch, 128, 1, 128, n, page_size=16, device="cuda", seed=i, draw_on="device")
               for i in range(sets_for(batch * n * 512))]
        for s in sorted({1, 2, 3, 4, 6, 8, 12, 16} | {max(1, 132 // batch), max(1, 264 // batch)}):
            if batch * s > 1100 or n // s < 256:
                continue
            for name in ("tl", "wide"):
                def make(x, s=s, name=name):
                    if name == "tl":
                        return lambda: gqa_decode(**x, num_splits=s)
                    return lambda: wide.gqa_wide(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                                 x["seq_lens"], s)
                t = time_graph([make(x) for x in ins], replays=20)
                emit(path, B=batch, n=n, s=s, impl=name, us=t.p50_us, roof=floor_us(batch, 128, 1, n) / t.p50_us)
        del ins
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
