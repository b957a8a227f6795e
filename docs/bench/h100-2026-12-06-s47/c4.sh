#!/usr/bin/env bash
# Session 47 call 4, on ca90 (= main ed9b6b5's kernels and planner): the closing figures.
# (1) the whole-trace replay with --batch_invariant (re-runs sampled requests alone, bitwise);
# (2) overhead.py --issue_rows beside FlashInfer (issue 15's table); (3) fp8 / bf16 decode rows
# at head_dim 64 / 256 beside FlashInfer, in what is left.
source tools/gpu/call_lib.sh .device_run/k4.tar.xz
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/ca90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "replay --batch_invariant"
timeout 300 python3 tools/replay/replay.py --device=cuda --max_requests=0 --check_every=100 --batch_invariant \
  --noprogress > $OUT/r/replay_invariant.txt 2>&1
echo "rc=$?" >> $OUT/r/replay_invariant.txt; tail -12 $OUT/r/replay_invariant.txt | tee -a $OUT/log.txt
log "overhead --issue_rows"
timeout 120 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead rc=$?"
T=$(left 560)
if (( T > 60 )); then
  log "fp8 rows (timeout ${T}s)"
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^decode (24 x (4096|8192|16384)|16 x 4096|1 x 32768) d(64|256)$' --time_budget_s=$(( T - 20 )) \
    --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
  log "bench rc=$?"
fi
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
