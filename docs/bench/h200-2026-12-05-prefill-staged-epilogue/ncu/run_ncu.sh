#!/usr/bin/env bash
# Stop 52: ncu of the staged-epilogue prefill (E = 0139c73) beside FA3, d128 causal 8x2048 and 1x16384.
# carry: [".device_run/e.tar.xz", ".device_run/callN.sh", ".device_peers/peers3.tar.xz"]
set -u
[ -d E ] || (xz -dc .device_run/e.tar.xz | tar xf -)
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > /dev/null 2>&1
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
mkdir -p $OUT/N
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats"
mets="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_write.sum,smsp__inst_executed.sum,sm__cycles_active.avg,dram__bytes_read.sum,dram__bytes_write.sum"
for shape in 8x2048 1x16384; do
  timeout 120 ncu --launch-skip 1 --launch-count 1 -k regex:PrefillSm90 $secs $mets -o $OUT/N/sk_$shape python3 tools/gpu/prefill_profile.py splitkv $shape > $OUT/N/ncu_sk_$shape.log 2>&1; echo "sk $shape rc=$?"
  timeout 120 ncu --launch-skip 1 --launch-count 1 -k regex:device_kernel $secs $mets -o $OUT/N/fa3_$shape python3 tools/gpu/prefill_profile.py fa3 $shape > $OUT/N/ncu_fa3_$shape.log 2>&1; echo "fa3 $shape rc=$?"
  for x in sk fa3; do ncu -i $OUT/N/${x}_$shape.ncu-rep --page details > $OUT/N/${x}_${shape}_details.txt 2>&1; done
done
for f in $OUT/N/*_details.txt; do echo "== $f"; grep -E "Duration|gmma|sectors_op_write|inst_executed.sum|Achieved Occupancy|Eligible Warps|Issued Warp|No Eligible|Registers Per|dram__bytes" $f | head -20; done
rm -f $OUT/N/*.ncu-rep
