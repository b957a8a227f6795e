#!/usr/bin/env bash
# Session 49 call 2: on an H200, session 44's 4-part ring for the invariant d128 decode's
# one-CTA grids (r4 = rv61 + decode_s_ahead_d128_ring4.patch) against m61 (= main 0f3e48d's
# kernels), invariant_cost.py d128 alternated; then the whole trace over an fp8 cache with the
# default model on m61's kernels (r4 where the A/B ran, the same kernels for fp8).
source tools/gpu/call_lib.sh .device_run61/k3.tar.xz
mkdir -p $OUT/r
if on_h200; then
  inv m61 128 1; inv r4 128 1; inv r4 128 2; inv m61 128 2
  log "ring4 A/B done"; cp $OUT/inv128.txt $OUT/r/
fi
export PYTHONPATH=/tmp/ab/m61:$PWD/tests/python:$PWD:${PYTHONPATH:-}
T=$(left 575)
log "default-model fp8 replay (timeout ${T}s)"
timeout $T python3 tools/replay/replay.py --device=cuda --kv_dtype=fp8_e4m3 --max_requests=0 --check_every=200 \
  --noprogress > $OUT/r/replay_fp8.txt 2>&1
echo "rc=$?" >> $OUT/r/replay_fp8.txt; tail -14 $OUT/r/replay_fp8.txt | tee -a $OUT/log.txt
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
