#!/usr/bin/env bash
# Session 47 call 3. ca90 = main90 (09b9171) + LoadInput as ld.global.ca (L1-cached, like
# __ldg) + head_dim 256 fp8 decode's fill-wave rule for grids past one CTA an SM.
# (1) prefill A/B old90 / main90 / ca90 (d128 and d64), (2) short decode A/B main90 / ca90,
# (3) ca90's fp8 d256 plans, (4) GPU tests + sanitizers on ca90, (5) whole-trace replay on ca90.
source tools/gpu/call_lib.sh .device_run/k3.tar.xz
mkdir -p $OUT/r
export PYTHONPATH_BASE=$PWD/tests/python:$PWD
for pkg in old90 main90 ca90 ca90 main90 old90; do
  echo "-- $pkg" >> $OUT/r/prefill.txt
  PYTHONPATH=/tmp/ab/$pkg:$PYTHONPATH_BASE timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 8x2048 4x4096 trace \
    >> $OUT/r/prefill.txt 2>&1
  PYTHONPATH=/tmp/ab/$pkg:$PYTHONPATH_BASE timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 4x4096 trace \
    >> $OUT/r/prefill.txt 2>&1
done
log "prefill done"
b() { # b PACKAGE TAG
  PYTHONPATH=/tmp/ab/$1:$PYTHONPATH_BASE timeout 60 python3 tools/bench/bench.py --device=cuda \
    --shapes=short_splits --noflex --max_gather_gb=0 --noserving_peers --only='^decode' --plot=false --out_dir=$OUT/r/$2 > $OUT/r/$2.log 2>&1
  log "bench $2 rc=$?"
}
b main90 short_main90_1; b ca90 short_ca90_1; b ca90 short_ca90_2; b main90 short_main90_2
echo "-- ca90 d256f8" >> $OUT/r/probe.txt
PYTHONPATH=/tmp/ab/ca90:$PYTHONPATH_BASE timeout 60 python3 tools/gpu/decode_profile.py --time --head_dim=256 --fp8 \
  24x4096 24x8192 20x8192 16x4096 12x16384 8x16384 >> $OUT/r/probe.txt 2>&1
log "probe rc=$?"
gpu_tests ca90
sanitize ca90 memcheck racecheck synccheck
T=$(left 575); log "replay, default mode (timeout ${T}s)"
PYTHONPATH=/tmp/ab/ca90:$PYTHONPATH_BASE timeout $T python3 tools/replay/replay.py --device=cuda --max_requests=0 \
  --check_every=100 --noprogress > $OUT/r/replay.txt 2>&1
echo "rc=$?" >> $OUT/r/replay.txt; tail -8 $OUT/r/replay.txt | tee -a $OUT/log.txt
log done
cp $OUT/log.txt $OUT/pytest_*.log $OUT/sanitizer_*.log $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
