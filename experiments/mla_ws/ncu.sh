#!/bin/bash
# Nsight Compute sections for MLA decodes, splitlab's kernels beside FlashMLA's (clocks as found, caches flushed),
# from the repository root:   bash experiments/mla_ws/ncu.sh OUTDIR [KIT]
set -u
O=$1; KIT=${2:-.fmla}; mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" > "$O/ncu.txt"; $NCU --version >> "$O/ncu.txt" 2>&1
CASES="splitlab:128:64:8192:uniform splitlab@flashmla:128:64:8192:uniform flashmla:128:64:8192:uniform
 splitlab:128:64:32768:longtail flashmla:128:64:32768:longtail
 splitlab:16:64:8192:uniform flashmla:16:64:8192:uniform"
timeout 400 $NCU --profile-from-start off --clock-control none --cache-control all \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --csv --page details \
  python "$(dirname "$0")/ncu_probe.py" --fmla "$KIT" $CASES > "$O/ncu_raw.csv" 2> "$O/ncu.err"
echo "rc=$?" >> "$O/ncu.txt"
grep '^CASE\|unavailable' "$O/ncu_raw.csv" >> "$O/ncu.txt"
cat "$O/ncu.txt"
