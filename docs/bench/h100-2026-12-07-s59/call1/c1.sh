#!/usr/bin/env bash
# Session 59 call 1 (asks for an H200): on an H200, the closing figures of issues 15-18 on
# main cd0cc85 (k10): host time per call beside FlashInfer, the invariant decode's cost at
# d64 / d128, fp8 against bf16 decode, d128 prefill beside FlashInfer and FA3.
# On another card: nothing (this stop's H100 time goes to the NaN change's tests).
source tools/gpu/call_lib.sh .device_run80/kits.tar.xz
mkdir -p $OUT/r
if ! on_h200; then log "not an H200: nothing run"; cp $OUT/log.txt $OUT/gpu.txt $OUT/r/; exit 0; fi
source tools/gpu/install_peers.sh .device_run80/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/k10:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
for d in 64 128; do
  timeout 75 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d --rounds=2 > $OUT/r/inv$d.txt 2>&1
  log "inv d$d rc=$?"
done
T=$(left 400)
timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
  --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( T - 20 )) --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
log "fp8 decode bench rc=$?"
T=$(left 555)
timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
  --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d128$' --time_budget_s=$(( T - 15 )) --out_dir=$OUT/r/prepeers > $OUT/r/prepeers.log 2>&1
log "prefill+peers bench rc=$?"
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
