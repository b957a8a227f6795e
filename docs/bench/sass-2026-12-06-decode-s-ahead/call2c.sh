#!/usr/bin/env bash
# Device call 2c: ab2c = main90 ovl90 dec90 sahead90 (sm_90a-only; main90/splitkv_reference shared).
# carry: [".device_run/ab2c.tar.xz", ".device_run/call2c.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/ab2c.tar.xz -C /tmp/ab
for v in ovl90 dec90 sahead90; do [ -d /tmp/ab/$v/splitkv_reference ] || cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
el() { echo $(( $(date +%s) - T0 )); }
log "tests sahead90"
PYTHONPATH=/tmp/ab/sahead90:tests/python timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py \
  > $OUT/tests_sahead90.log 2>&1; echo "rc=$?" >> $OUT/tests_sahead90.log; tail -2 $OUT/tests_sahead90.log | tee -a $OUT/log.txt
inv() {  # inv <variant> <head_dim> <round label>
  echo "-- $1 $3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 90 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1
}
log "invariant decode d64 main/dec/sahead"; inv main90 64 r1; inv sahead90 64 r1; inv dec90 64 r1
log "invariant decode d128 main/sahead"; inv sahead90 128 r1; inv main90 128 r1
[ $(el) -lt 440 ] && { log "d64 r2"; inv sahead90 64 r2; inv main90 64 r2; }
if [ $(el) -lt 480 ]; then
  log "A/B d128 prefill r3"
  for v in main90 ovl90; do
    echo "-- $v r3" >> $OUT/ab128.txt
    PYTHONPATH=/tmp/ab/$v timeout 45 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=128 1x16384 4x4096 8x2048 trace 64x256 >> $OUT/ab128.txt 2>&1
  done
fi
log done
