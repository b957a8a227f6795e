#!/usr/bin/env bash
# Device call Y (docs/bench/sass-2026-12-06-decode-s-ahead/): aby = main90 sa4all90 sa64_90 noskip90
# (sm_90a-only; main90/splitkv_reference shared). carry: [".device_run/aby.tar.xz", ".device_run/cally.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/aby.tar.xz -C /tmp/ab
for v in sa4all90 sa64_90 noskip90; do cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
el() { echo $(( $(date +%s) - T0 )); }
tests() {  # tests <variant> <timeout> <pytest args...>
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
log "tests sa4all90 (every gpu test)"; tests sa4all90 200 tests/python
log "invariant decode d128 r1"; inv main90 128 1; inv sa4all90 128 1
log "tests sa64_90"; tests sa64_90 100 tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py
log "invariant decode d128 sa64, d64 sa4all"; inv sa64_90 128 1; inv sa4all90 64 1
log "prefill noskip"; prof main90 128 1; prof noskip90 128 1; prof noskip90 64 1; prof main90 64 1
log "invariant decode d128 r2"; inv sa4all90 128 2; inv main90 128 2
log "sanitize sa4all90"
ln -sfn /tmp/ab/sa4all90 .device_sa
SPLITKV_DEVICE_DIR=.device_sa OUT=$OUT/san timeout 140 bash tools/gpu/run_checks.sh sanitize > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|rc=" $OUT/san/sanitizer.log | tee -a $OUT/log.txt
log done
