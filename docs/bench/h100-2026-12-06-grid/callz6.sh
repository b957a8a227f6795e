#!/usr/bin/env bash
# Device call Z6: (1) d128 invariant decode, main 65e5c2f (cur90) against exp/decode-s-ahead-d128-ring4
# (sa128_90), alternated; (2) the head_dim-128 decode grid and every prefill row beside FlashInfer
# 0.7.2 / FA3 3.0.0 on main (cur90), every row checked against float64.
# carry: [".device_run/abz5.tar.xz", ".device_run/peers.tar.xz", ".device_run/callz6.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abz5.tar.xz -C /tmp/ab
cp -r /tmp/ab/cur90/splitkv_reference /tmp/ab/sa128_90/
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
log "d128 A/B"; inv cur90 128 1; inv sa128_90 128 1; inv sa128_90 128 2; inv cur90 128 2
grep -E "^-- |1 x 32768|8 x 4096" $OUT/inv128.txt | tee -a $OUT/log.txt
log "peers"
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/cur90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
left=$(( 545 - ($(date +%s) - T0) ))
log "grid (timeout ${left}s)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu_grid.txt
timeout $left python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^(decode .* d128|prefill .*)$' --time_budget_s=$(( left - 70 )) --out_dir=$OUT/grid > $OUT/bench.log 2>&1
echo "bench rc=$?" | tee -a $OUT/log.txt; tail -5 $OUT/bench.log
log done
