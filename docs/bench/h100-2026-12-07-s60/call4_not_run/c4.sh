#!/usr/bin/env bash
# Session 60 call 4: k14 = main cb7e88a (the C++ layout key with option values, the full
# path's null refusals, runners on the C++ key) against k11 = main 42d661a.
# On an H200: k11's host-time rows, then the closing figures of issues 15-18 on k14.
# Else: every test marked gpu on k14, host time (k14, k11), the trace's first 2000 requests.
source tools/gpu/call_lib.sh .device_run88/kits.tar.xz
mkdir -p $OUT/r
if on_h200; then
  source tools/gpu/install_peers.sh .device_run88/peers.tar.xz > $OUT/r/peers_k11.txt 2>&1
  PYTHONPATH=$CALL_PKGS/k11:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows \
    --iters=2000 --out_dir=$OUT/r/overhead_k11 > $OUT/r/overhead_k11.log 2>&1
  log "overhead k11 rc=$?"; echo "-- k11" >> $OUT/log.txt; cat $OUT/r/overhead_k11/overhead.md >> $OUT/log.txt 2>/dev/null
  echo "-- k14 (closing figures)" >> $OUT/log.txt
  closing_figures k14 .device_run88/peers.tar.xz $OUT/r 565; log done; exit 0
fi
gpu_tests k14
source tools/gpu/install_peers.sh .device_run88/peers.tar.xz > $OUT/peers.txt 2>&1
for pkg in k14 k11; do
  PYTHONPATH=$CALL_PKGS/$pkg:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout 100 python3 tools/bench/overhead.py --device=cuda \
    --iters=2000 --out_dir=$OUT/overhead_$pkg > $OUT/overhead_$pkg.log 2>&1
  log "overhead $pkg rc=$?"; echo "-- $pkg" >> $OUT/log.txt; cat $OUT/overhead_$pkg/overhead.md >> $OUT/log.txt 2>/dev/null
done
PYTHONPATH=$CALL_PKGS/k14:$PWD/tests/python:$PWD timeout $(left 400) python3 tools/replay/replay.py --device=cuda \
  --max_requests=2000 --check_every=50 --noprogress > $OUT/replay.txt 2>&1
log "replay 2000 requests (k14) rc=$?"; tail -14 $OUT/replay.txt >> $OUT/log.txt
log done
