#!/usr/bin/env bash
# Device call Z: d128 invariant decode, main vs exp/decode-s-ahead-ring4-all, alternating (aby.tar.xz).
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/aby.tar.xz -C /tmp/ab main90 sa4all90
cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/sa4all90/
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
log "d128"; inv main90 128 1; inv sa4all90 128 1; inv sa4all90 128 2; inv main90 128 2
log "d64"; inv main90 64 1; inv sa4all90 64 1
log done
