#!/usr/bin/env bash
# Session 59 call 2: the CUDA NaN change (k11 = main cd0cc85 + RowSeen) against main (k10).
# Its tests on both backends, the whole GPU suite and memcheck on k11, then the decode rows
# (default and invariant, d64 / d128) and the prefill rows of invariant_cost.py, k10 and k11
# alternated, to show the change is level on finite inputs.
source tools/gpu/call_lib.sh .device_run81/kits.tar.xz
PYTHONPATH=$CALL_PKGS/k11:tests/python timeout 120 python3 -m pytest tests/python/bad_inputs_test.py -k nonfinite -q -rs \
  -p no:cacheprovider > $OUT/nan_k11.log 2>&1
log "nonfinite tests (k11) rc=$?"; tail -1 $OUT/nan_k11.log | tee -a $OUT/log.txt
PYTHONPATH=$CALL_PKGS/k10:tests/python timeout 60 python3 -m pytest tests/python/bad_inputs_test.py -k "through_every_merge and cuda" -q \
  -p no:cacheprovider > $OUT/nan_k10.log 2>&1
log "new nonfinite test on main (k10, expected to fail on cuda) rc=$?"; tail -1 $OUT/nan_k10.log | tee -a $OUT/log.txt
gpu_tests k11
sanitize k11 memcheck
for r in 1; do
  inv k10 64 $r; inv k11 64 $r; inv k11 128 $r; inv k10 128 $r
done
log "inv done"
for pkg in k10 k11 k11 k10; do
  echo "-- $pkg" >> $OUT/prefill.txt
  PYTHONPATH=$CALL_PKGS/$pkg timeout $(left 570) python3 tools/bench/invariant_cost.py --device=cuda --kinds=prefill \
    --head_dim=128 --rounds=1 >> $OUT/prefill.txt 2>&1
  log "prefill $pkg rc=$?"
done
log done
