#!/usr/bin/env bash
# Session 62 call 2: k18. The whole trace with --batch_invariant (issue 16) and over an fp8
# cache (issue 17), then the invariant decode's cost at d128 / d64.
source tools/gpu/call_lib.sh .device_run90/kits.tar.xz
export PYTHONPATH=$CALL_PKGS/k18:$PWD/tests/python:$PWD
timeout 240 python3 tools/replay/replay.py --device=cuda --batch_invariant --max_requests=0 --check_every=100 \
  --noprogress > $OUT/replay_inv.txt 2>&1
log "inv replay rc=$?"; tail -16 $OUT/replay_inv.txt >> $OUT/log.txt
timeout $(left 480) python3 tools/replay/replay.py --device=cuda --kv_dtype=fp8_e4m3 --max_requests=0 \
  --check_every=200 --noprogress > $OUT/replay_fp8.txt 2>&1
log "fp8 replay rc=$?"; tail -16 $OUT/replay_fp8.txt >> $OUT/log.txt
for d in 128 64; do
  timeout $(left 585) python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d \
    --rounds=2 > $OUT/inv$d.txt 2>&1
  log "inv d$d rc=$?"
done
log done
