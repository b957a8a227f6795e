#!/usr/bin/env bash
# One device call for both pending A/Bs (issue 18's softmax patch, issue 16's S-ahead decode):
# abx = main90 ovl90 sahead90 sahead4_90 (sm_90a-only; main90/splitkv_reference shared).
# carry: [".device_run/abx.tar.xz", ".device_run/callx.sh"]. Steps in order of need.
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abx.tar.xz -C /tmp/ab
for v in ovl90 sahead90 sahead4_90; do cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
el() { echo $(( $(date +%s) - T0 )); }
tests() {  # tests <variant> <timeout> <files...>
  local v=$1 t=$2; shift 2
  PYTHONPATH=/tmp/ab/$v:tests/python timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" \
    > $OUT/tests_$v.log 2>&1; echo "rc=$?" >> $OUT/tests_$v.log; tail -2 $OUT/tests_$v.log | tee -a $OUT/log.txt
}
prof() {  # prof <variant> <head_dim> <round>
  echo "-- $1 r$3" >> $OUT/ab$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 45 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$2 1x16384 4x4096 8x2048 trace 64x256 >> $OUT/ab$2.txt 2>&1
}
inv() {  # inv <variant> <head_dim> <round>
  echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1
}
log "tests ovl90"; tests ovl90 120 tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/sinks_test.py tests/python/batch_invariant_test.py tests/python/ragged_attention_test.py
log "tests sahead4_90"; tests sahead4_90 100 tests/python/batch_invariant_test.py tests/python/paged_attention_test.py
log "prefill d128 r1"; prof main90 128 1; prof ovl90 128 1
log "invariant decode d64 r1"; inv main90 64 1; inv sahead4_90 64 1; inv sahead90 64 1
log "prefill d64 r1"; prof main90 64 1; prof ovl90 64 1
[ $(el) -lt 470 ] && { log "invariant decode d128 r1"; inv sahead90 128 1; inv main90 128 1; }
[ $(el) -lt 520 ] && { log "prefill d128 r2"; prof ovl90 128 2; prof main90 128 2; }
log done
