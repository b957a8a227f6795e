#!/usr/bin/env bash
# Device call Z4 (next session): d128 invariant decode, old main (main90, before S-ahead) vs current main
# (cur90, c212b02: S-ahead on 3 parts at d128) vs exp/decode-s-ahead-d128-ring4 (sa128_90).
# carry: [".device_run/abz4.tar.xz", ".device_run/callz4.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abz4.tar.xz -C /tmp/ab
for v in cur90 sa128_90; do cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
log "tests sa128_90"
PYTHONPATH=/tmp/ab/sa128_90:tests/python timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py \
  > $OUT/tests_sa128_90.log 2>&1; echo "rc=$?" >> $OUT/tests_sa128_90.log; tail -2 $OUT/tests_sa128_90.log | tee -a $OUT/log.txt
log "d128"; inv cur90 128 1; inv sa128_90 128 1; inv main90 128 1; inv main90 128 2; inv sa128_90 128 2; inv cur90 128 2
log done
