#!/usr/bin/env bash
# Device call Z7: (1) whole-trace replay with --batch_invariant on main 65e5c2f (cur90); (2) on an
# H200 only, the d128 invariant decode A/B of main against exp/decode-s-ahead-d128-ring4 (sa128_90).
# carry: [".device_run/abz5.tar.xz", ".device_run/callz7.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abz5.tar.xz -C /tmp/ab
cp -r /tmp/ab/cur90/splitkv_reference /tmp/ab/sa128_90/
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
if grep -q H200 $OUT/gpu.txt; then
  log "d128 A/B"; inv cur90 128 1; inv sa128_90 128 1; inv sa128_90 128 2; inv cur90 128 2
  grep -E "^-- |1 x 32768|8 x 4096" $OUT/inv128.txt | tee -a $OUT/log.txt
fi
log "replay --batch_invariant cur90"
PYTHONPATH=/tmp/ab/cur90:$PWD timeout 220 python3 tools/replay/replay.py --device=cuda --max_requests=0 \
  --batch_invariant --check_every=100 --noprogress > $OUT/replay_batch_invariant.txt 2>&1
echo "rc=$?" >> $OUT/replay_batch_invariant.txt; tail -14 $OUT/replay_batch_invariant.txt | tee -a $OUT/log.txt
log done
