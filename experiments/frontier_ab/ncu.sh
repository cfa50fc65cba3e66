#!/bin/bash
# Nsight Compute sections for a few decodes (clocks as found, caches flushed), from the repository root:
#   bash experiments/frontier_ab/ncu.sh OUTDIR
set -u
O=$1; mkdir -p $O
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" > $O/ncu.txt; $NCU --version >> $O/ncu.txt 2>&1
for c in tl:128:1:64:8192:2 tl:128:1:16:32768:8 tl:32:8:16:1024:2 cudnn:32:8:16:1024:0 tl64:32:8:16:1024:1 tl:32:8:64:8192:3 cudnn:32:8:64:8192:0; do
  timeout 120 $NCU --profile-from-start off --clock-control none --cache-control all \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --csv --page details \
    python "$(dirname "$0")/ncu_probe.py" $c > "$O/${c//:/_}.csv" 2> "$O/${c//:/_}.err"
  echo "$c rc=$?" >> $O/ncu.txt
done
cat $O/ncu.txt
