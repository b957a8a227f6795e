#!/usr/bin/env bash
# Session 59 call 3, on k11 (main + RowSeen: 85b3f2f's kernels). On an H200: the closing
# figures (call_lib.sh closing_figures). Else: the new hidden-key test (a non-finite key hidden
# by the causal mask from earlier rows of its tile) on both backends, racecheck, and the whole
# trace with --batch_invariant (the merges changed).
source tools/gpu/call_lib.sh .device_run82/kits.tar.xz
if on_h200; then closing_figures k11 .device_run82/peers.tar.xz $OUT/r 555; log done; exit 0; fi
PYTHONPATH=$CALL_PKGS/k11:tests/python timeout 120 python3 -m pytest tests/python/bad_inputs_test.py -k "hidden_from_earlier" -q -rs \
  -p no:cacheprovider > $OUT/hidden_k11.log 2>&1
log "hidden-key tests (k11) rc=$?"; grep -E "^FAILED" $OUT/hidden_k11.log | head -30 >> $OUT/log.txt; tail -1 $OUT/hidden_k11.log | tee -a $OUT/log.txt
sanitize k11 racecheck
PYTHONPATH=$CALL_PKGS/k11:$PWD/tests/python:$PWD timeout $(left 560) python3 tools/replay/replay.py --device=cuda \
  --batch_invariant --max_requests=0 --check_every=100 --noprogress > $OUT/replay_inv.txt 2>&1
log "replay --batch_invariant (whole trace) rc=$?"; tail -14 $OUT/replay_inv.txt >> $OUT/log.txt
log done
