#!/usr/bin/env bash
# Session 61 call 1: k17 = main d6dc55d (the per-call path keyed in C++ in one Python function,
# raw C++ read launches, refusal order, the adapter's freed workspaces) -- first GPU run of
# cb7e88a..d6dc55d -- beside k15 = main 09f0156 and k11 = main 42d661a (host time). Most
# important first (the device time left may cut it short): every test marked gpu on k17;
# host time k17 (issue 15's rows beside FlashInfer), k15, k11; on an H200 the rest of the
# closing figures (invariant decode cost, fp8 decode rows, d128 prefill beside the peers);
# else the trace's first 2000 requests on k17.
source tools/gpu/call_lib.sh .device_run89/kits.tar.xz
gpu_tests k17
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run89/peers.tar.xz > $OUT/r/peers.txt 2>&1
PYTHONPATH=$CALL_PKGS/k17:$PWD/tests/python:$PWD timeout 100 python3 tools/bench/overhead.py --device=cuda \
  --issue_rows --iters=2000 --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead k17 rc=$?"; echo "-- k17" >> $OUT/log.txt; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
for pkg in k15 k11; do
  PYTHONPATH=$CALL_PKGS/$pkg:$PWD/tests/python:$PWD timeout 40 python3 tools/bench/overhead.py --device=cuda \
    --iters=2000 --out_dir=$OUT/r/overhead_$pkg > $OUT/r/overhead_$pkg.log 2>&1
  log "overhead $pkg rc=$?"; echo "-- $pkg" >> $OUT/log.txt; cat $OUT/r/overhead_$pkg/overhead.md >> $OUT/log.txt 2>/dev/null
done
export PYTHONPATH=$CALL_PKGS/k17:$PWD/tests/python:$PWD
if on_h200; then
  timeout 75 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=64 --rounds=2 \
    > $OUT/r/inv64.txt 2>&1; log "inv d64 rc=$?"
  timeout $(left 520) python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --plot=false --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( $(left 520) - 20 )) \
    --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1; log "fp8 decode bench rc=$?"
  timeout $(left 575) python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --plot=false --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d128$' --time_budget_s=$(( $(left 575) - 15 )) \
    --out_dir=$OUT/r/prepeers > $OUT/r/prepeers.log 2>&1; log "prefill+peers bench rc=$?"
  log done; exit 0
fi
timeout $(left 560) python3 tools/replay/replay.py --device=cuda --max_requests=2000 --check_every=50 --noprogress \
  > $OUT/replay.txt 2>&1
log "replay 2000 requests (k17) rc=$?"; tail -14 $OUT/replay.txt >> $OUT/log.txt
log done
