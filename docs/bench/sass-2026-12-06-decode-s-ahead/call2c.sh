#!/usr/bin/env bash
# Device call 2c (docs/bench/sass-2026-12-06-decode-s-ahead/): ab2c = main90 dec90 sahead90 sahead4_90
# (sm_90a-only; main90/splitkv_reference shared). carry: [".device_run/ab2c.tar.xz", ".device_run/call2c.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/ab2c.tar.xz -C /tmp/ab
for v in dec90 sahead90 sahead4_90; do [ -d /tmp/ab/$v/splitkv_reference ] || cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
el() { echo $(( $(date +%s) - T0 )); }
tests() {  # tests <variant> <files...>
  local v=$1; shift
  PYTHONPATH=/tmp/ab/$v:tests/python timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu "$@" \
    > $OUT/tests_$v.log 2>&1; echo "rc=$?" >> $OUT/tests_$v.log; tail -2 $OUT/tests_$v.log | tee -a $OUT/log.txt
}
inv() {  # inv <variant> <head_dim> <round label>
  echo "-- $1 $3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 80 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1
}
log "tests sahead90"; tests sahead90 tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py
log "tests sahead4_90"; tests sahead4_90 tests/python/batch_invariant_test.py
log "invariant decode d64"; inv main90 64 r1; inv sahead90 64 r1; inv sahead4_90 64 r1; inv dec90 64 r1
log "invariant decode d128"; inv sahead90 128 r1; inv main90 128 r1
[ $(el) -lt 500 ] && { log "d64 r2"; inv sahead4_90 64 r2; inv main90 64 r2; }
log done
