#!/usr/bin/env bash
# Session 47 call 6, on ca90 (= main 5abeeae's kernels and planner): the invariant mode's
# decode cost at head_dim 128 and 64 (issue 16's table), then the short decode cells beside
# FlashInfer's XQA (issue 18's short table).
source tools/gpu/call_lib.sh .device_run/k4.tar.xz
mkdir -p $OUT/r
inv ca90 128 1; inv ca90 64 1
log "invariant done"
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/ca90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout $(left 200) python3 tools/bench/bench.py --device=cuda --shapes=short_splits --noflex --max_gather_gb=0 \
  --only='^decode' --plot=false --out_dir=$OUT/r/short > $OUT/r/short.log 2>&1
log "bench rc=$?"
cp $OUT/log.txt $OUT/inv*.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
