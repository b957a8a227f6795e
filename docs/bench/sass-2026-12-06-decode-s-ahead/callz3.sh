#!/usr/bin/env bash
# Device call Z3: main vs exp/decode-s-ahead-d128-ring4 (the 4-part ring at d128 one-CTA-an-SM grids).
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abz.tar.xz -C /tmp/ab
cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/sa128_90/
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
log "tests sa128_90"
PYTHONPATH=/tmp/ab/sa128_90:tests/python timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py \
  > $OUT/tests_sa128_90.log 2>&1; echo "rc=$?" >> $OUT/tests_sa128_90.log; tail -2 $OUT/tests_sa128_90.log | tee -a $OUT/log.txt
log "d128"; inv main90 128 1; inv sa128_90 128 1; inv sa128_90 128 2; inv main90 128 2
log done
