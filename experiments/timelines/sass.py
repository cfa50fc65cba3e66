"""What the timeline recording changes in the MQA-128 work-list tile's machine code (sm_90a, no GPU needed).

    python experiments/timelines/sass.py

Compiles ``worklist._gqa_worklist_kernel`` for MQA-128 (128 query heads on one kv head, D 128, page 16, bf16, one
item a slot) with timelines off and on, through Triton's pipeline with a stand-in driver (``tests/sm90.py``'s
preamble), disassembles both cubins with the bundled cuobjdump and prints, for each build, its registers, its SASS
instruction count, and each loop (a backward branch): its length and its most frequent opcodes. The question: does
recording a timeline (64 bytes a program, a clock read at the start and the end) lengthen the key loop, or only
change how ptxas orders it?
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BODY = r'''
x = gqa_inputs(2, 128, 1, 128, lens, page_size=16, dtype=torch.bfloat16)
work = wl.WorkList.from_schedule(S.uniform(lens, 4), "cpu")
for t in (None, timeline.Timelines()):
    wl.gqa_decode_scheduled(x["q"], x["k_cache"], x["v_cache"], x["block_table"], work, timelines=t)
# each call compiles the partial kernel, then the merge
for name, k in (("plain", compiled[0]), ("timed", compiled[2])):
    with open(os.path.join(OUT, name + ".cubin"), "wb") as f:
        f.write(k.asm["cubin"])
    print(name, usage(k))
print("cuobjdump", cuobjdump)
'''


def loops(sass: str) -> tuple[list[tuple[int, int, list[str]]], int]:
    """Each backward branch's (start, end, the opcodes between), and the instruction count, from cuobjdump -sass."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           (re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    out = []
    for a, text in ins:
        target = re.search(r"0x([0-9a-f]+)", text) if "BRA" in text else None
        if target and int(target.group(1), 16) < a:
            lo = int(target.group(1), 16)
            out.append((lo, a, [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for b, t in ins
                                if lo <= b <= a]))
    return out, len(ins)


def main() -> int:
    sys.path.insert(0, str(REPO / "tests"))
    from sm90 import PREAMBLE, WORKLIST

    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        r = subprocess.run([sys.executable, "-c", f"OUT = {out!r}\n" + PREAMBLE + WORKLIST + BODY], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            print(r.stdout + r.stderr[-3000:])
            return r.returncode
        lines = r.stdout.splitlines()
        cuobjdump = lines[-1].split(" ", 1)[1]
        for line in lines[:-1]:
            name = line.split()[0]
            sass = subprocess.run([cuobjdump, "-sass", os.path.join(out, name + ".cubin")], capture_output=True,
                                  text=True).stdout
            found, total = loops(sass)
            print(f"{line}: {total} SASS instructions")
            for lo, hi, ops in found:
                top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(8))
                print(f"  loop {lo:#x}-{hi:#x}: {len(ops)} instructions ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
