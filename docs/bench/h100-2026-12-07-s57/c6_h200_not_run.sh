#!/usr/bin/env bash
# Session 57 call 5: on an H200 only, issues 15-17's closing figures on main aaf7c75's package
# (k6; later commits are Python-only outside the transformers adapter): host time per call
# beside FlashInfer, the invariant decode's cost at d64 / d128, fp8 against bf16 decode. On
# any other card: nothing.
source tools/gpu/call_lib.sh .device_run78/kits.tar.xz
mkdir -p $OUT/r
if ! on_h200; then log "not an H200: nothing run"; exit 0; fi
source tools/gpu/install_peers.sh .device_run78/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/k6:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 90 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=1000 --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead rc=$?"
for d in 64 128; do
  timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d --rounds=1 > $OUT/r/inv$d.txt 2>&1
  log "inv d$d rc=$?"
done
T=$(left 330)
timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
  --only='^decode (24 x 4096|1 x 32768) d(64|128)$' --time_budget_s=$(( T - 15 )) --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
log "fp8 decode bench rc=$?"
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
