#!/usr/bin/env bash
# Session 57 call 2: A/B of the causal prefill walk's interleaved tail (k5 = k4 + PrefillTileAt)
# against main 34f9246 (k4): ab.py's kernel times alternated over processes, the trace batch,
# then FA3 beside both in one process each; k5's prefill / invariant GPU tests.
source tools/gpu/call_lib.sh .device_run75/kits.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_run75/flash_attn_3-*.whl > $OUT/fa3_install.txt 2>&1
log "fa3 install rc=$?"
for r in 1 2; do
  for pkg in k4 k5; do
    PYTHONPATH=$CALL_PKGS/$pkg timeout 90 python3 .device_run75/ab.py > $OUT/ab_${pkg}_$r.txt 2>&1
    log "ab $pkg r$r rc=$?"
    PYTHONPATH=$CALL_PKGS/$pkg:. timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 trace >> $OUT/ab_${pkg}_$r.txt 2>&1
    PYTHONPATH=$CALL_PKGS/$pkg:. timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 trace >> $OUT/ab_${pkg}_$r.txt 2>&1
  done
done
for pkg in k5 k4; do
  PYTHONPATH=$CALL_PKGS/$pkg:.:/tmp/site timeout 90 python3 tools/gpu/prefill_profile.py --time 8x2048 4x4096 1x16384 > $OUT/fa3_$pkg.txt 2>&1
  log "fa3 beside $pkg rc=$?"
done
PYTHONPATH=$CALL_PKGS/k5:tests/python timeout 200 python3 -m pytest tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py \
  tests/python/ragged_attention_test.py tests/python/batch_invariant_test.py tests/python/sinks_test.py -m gpu -q -p no:cacheprovider > $OUT/pytest_k5.log 2>&1
log "pytest k5 prefill rc=$?"; tail -1 $OUT/pytest_k5.log | tee -a $OUT/log.txt
grep -h "TFLOP" $OUT/ab_*.txt | head -0
log done
