#!/usr/bin/env bash
# Device call 2b: ab2b = main90 ovl90 uniform90 dec90 (sm_90a-only; main90/splitkv_reference shared).
# carry: [".device_run/ab2b.tar.xz", ".device_run/call2b.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/ab2b.tar.xz -C /tmp/ab
for v in ovl90 uniform90 dec90; do [ -d /tmp/ab/$v/splitkv_reference ] || cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
el() { echo $(( $(date +%s) - T0 )); }
log "tests dec90"
PYTHONPATH=/tmp/ab/dec90:tests/python timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/batch_invariant_test.py tests/python/paged_attention_test.py \
  > $OUT/tests_dec90.log 2>&1; echo "rc=$?" >> $OUT/tests_dec90.log; tail -2 $OUT/tests_dec90.log | tee -a $OUT/log.txt
log "invariant decode d64 main/dec"
for v in main90 dec90; do
  echo "-- $v" >> $OUT/inv64.txt
  PYTHONPATH=/tmp/ab/$v timeout 100 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=64 --rounds=2 >> $OUT/inv64.txt 2>&1
done
for hd in 128 64; do
  [ $(el) -lt 420 ] || break
  log "A/B d$hd"
  for v in main90 ovl90 uniform90; do
    echo "-- $v r1" >> $OUT/ab$hd.txt
    PYTHONPATH=/tmp/ab/$v timeout 45 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$hd 1x16384 4x4096 8x2048 trace 64x256 >> $OUT/ab$hd.txt 2>&1
  done
done
log done
