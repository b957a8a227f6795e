#!/usr/bin/env bash
# Device call 1 (docs/bench/sass-2026-12-05-softmax-beside-pv/README.md), steps in order of need:
# whatever finishes before the limit comes back. ab1 = main90 ovl90 noskip90 fma90 (sm_90a-only builds).
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/ab1.tar.xz -C /tmp/ab
for v in ovl90 noskip90 fma90; do cp -r /tmp/ab/main90/splitkv_reference /tmp/ab/$v/; done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
prof() {  # prof <variant> <head_dim> <round>
  echo "-- $1 r$3" >> $OUT/ab$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 45 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$2 1x16384 4x4096 8x2048 trace 64x256 >> $OUT/ab$2.txt 2>&1
}
log "tests ovl90"
PYTHONPATH=/tmp/ab/ovl90:tests/python timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/sinks_test.py \
  tests/python/batch_invariant_test.py tests/python/ragged_attention_test.py \
  > $OUT/tests_ovl90.log 2>&1; echo "rc=$?" >> $OUT/tests_ovl90.log; tail -2 $OUT/tests_ovl90.log | tee -a $OUT/log.txt
log "A/B r1"; prof main90 128 1; prof ovl90 128 1; prof main90 64 1; prof ovl90 64 1
log "A/B r2"; prof ovl90 128 2; prof main90 128 2; prof ovl90 64 2; prof main90 64 2
log "variants"; prof noskip90 128 1; prof fma90 64 1
log "d256"
for v in main90 ovl90; do
  echo "-- $v r1" >> $OUT/ab256.txt
  PYTHONPATH=/tmp/ab/$v timeout 45 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=256 4x4096 8x2048 trace 64x256 >> $OUT/ab256.txt 2>&1
done
log "sanitize ovl90"
ln -sfn /tmp/ab/ovl90 .device_ovl
SPLITKV_DEVICE_DIR=.device_ovl OUT=$OUT/san timeout 200 bash tools/gpu/run_checks.sh sanitize > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|rc=" $OUT/san/sanitizer.log | tee -a $OUT/log.txt
log done
