#!/usr/bin/env bash
# Session 60 call 3: k13 (efdca6f's extension) with main 02e7e5c's Python (runners key through
# the C++ layout key too) against main 42d661a (k11 with its Python).
# On an H200: k11's host-time rows, then the closing figures of issues 15-18 on k13.
# Else: the runners' and per-call tests on CUDA, host time again (k11, k13; another
# process, the host drifts), and a replay of the trace's first 2000 requests on CUDA.
source tools/gpu/call_lib.sh .device_run87/kits.tar.xz
chmod -R u+w $CALL_PKGS/k13 && cp python/splitkv/*.py $CALL_PKGS/k13/splitkv/ && cp python/splitkv/integrations/*.py $CALL_PKGS/k13/splitkv/integrations/
mkdir -p $OUT/r
if on_h200; then
  source tools/gpu/install_peers.sh .device_run87/peers.tar.xz > $OUT/r/peers_k11.txt 2>&1
  PYTHONPATH=$CALL_PKGS/k11:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows \
    --iters=2000 --out_dir=$OUT/r/overhead_k11 > $OUT/r/overhead_k11.log 2>&1
  log "overhead k11 rc=$?"; echo "-- k11" >> $OUT/log.txt; cat $OUT/r/overhead_k11/overhead.md >> $OUT/log.txt 2>/dev/null
  echo "-- k13 (closing figures)" >> $OUT/log.txt
  closing_figures k13 .device_run87/peers.tar.xz $OUT/r 565; log done; exit 0
fi
PYTHONPATH=$CALL_PKGS/k13:tests/python timeout 120 python3 -m pytest tests/python/runners_test.py tests/python/call_cache_test.py tests/python/bad_inputs_test.py \
  tests/python/out_argument_test.py tests/python/sinks_test.py tests/python/fp8_kv_test.py -q -rs -p no:cacheprovider > $OUT/tests_k13.log 2>&1
log "runners/call_cache/bad_inputs/out/sinks/fp8 tests (k13, cpu+gpu) rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_k13.log | head -20 >> $OUT/log.txt; tail -1 $OUT/tests_k13.log | tee -a $OUT/log.txt
source tools/gpu/install_peers.sh .device_run87/peers.tar.xz > $OUT/peers.txt 2>&1
for pkg in k13 k11; do
  PYTHONPATH=$CALL_PKGS/$pkg:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout 100 python3 tools/bench/overhead.py --device=cuda \
    --iters=2000 --out_dir=$OUT/overhead_$pkg > $OUT/overhead_$pkg.log 2>&1
  log "overhead $pkg rc=$?"; echo "-- $pkg" >> $OUT/log.txt; cat $OUT/overhead_$pkg/overhead.md >> $OUT/log.txt 2>/dev/null
done
PYTHONPATH=$CALL_PKGS/k13:$PWD/tests/python:$PWD timeout $(left 300) python3 tools/replay/replay.py --device=cuda \
  --max_requests=2000 --check_every=50 --noprogress > $OUT/replay.txt 2>&1
log "replay 2000 requests (k13) rc=$?"; tail -14 $OUT/replay.txt >> $OUT/log.txt
log done
