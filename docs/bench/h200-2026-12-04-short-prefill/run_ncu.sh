#!/usr/bin/env bash
set -u
mkdir -p B && tar xJf .device_run/y.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/peers > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis"
for shape in 64x256 1x16384; do
timeout 150 ncu --launch-skip 1 --launch-count 1 -k regex:PrefillSm90 $secs -o $OUT/sk_$shape python3 tools/gpu/prefill_profile.py splitkv $shape > $OUT/ncu_sk_$shape.log 2>&1; echo "sk $shape rc=$?"
timeout 150 ncu --launch-skip 1 --launch-count 1 -k regex:device_kernel $secs -o $OUT/fa3_$shape python3 tools/gpu/prefill_profile.py fa3 $shape > $OUT/ncu_fa3_$shape.log 2>&1; echo "fa3 $shape rc=$?"
for x in sk fa3; do ncu -i $OUT/${x}_$shape.ncu-rep --page details > $OUT/${x}_${shape}_details.txt 2>&1; done
done
for f in $OUT/*_details.txt; do echo "== $f"; grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Eligible Warps|Issued Warp|No Eligible|Grid Size|Registers Per|Waves Per SM|L2 Hit|L1/TEX Hit|Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued" $f | head -24; done
rm -f $OUT/*.ncu-rep
