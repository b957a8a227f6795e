#!/usr/bin/env bash
# Session 47 call 2. (1) Call 1 saw ragged prefill 8 x 2048 d128 at 463.5 TFLOP/s on main90
# (09b9171) against 515.6 on old90 (1259e89), one round: is it real, and PDL's (pdlx90: PDL
# with __ldg) or LoadInput's? (2) fw90 = main90 + head_dim 256 fp8 decode planned by the
# fill-wave rule: planned rows against main90's; (3) fp8 d64 1 x 32768 at forced 32-64 splits;
# (4) the whole-trace replay (default mode, float64 checks every 100th call) on fw90.
source tools/gpu/call_lib.sh .device_run/k2.tar.xz
mkdir -p $OUT/r
for pkg in old90 main90 pdlx90 pdlx90 main90 old90; do
  echo "-- $pkg" >> $OUT/r/prefill.txt
  PYTHONPATH=/tmp/ab/$pkg timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 8x2048 4x4096 trace \
    >> $OUT/r/prefill.txt 2>&1
done
log "prefill done"
p() { # p PACKAGE TAG ARGS...: decode_profile rows
  local pkg=$1 tag=$2; shift 2
  (( $(left 330) > 30 )) || { log "skip $tag: time"; return; }
  echo "-- $pkg $tag" >> $OUT/r/probe.txt
  PYTHONPATH=/tmp/ab/$pkg timeout 60 python3 tools/gpu/decode_profile.py --time "$@" > $OUT/r/probe_part.txt 2>&1
  echo "rc=$?" >> $OUT/r/probe_part.txt; cat $OUT/r/probe_part.txt >> $OUT/r/probe.txt
}
F8='24x4096 24x8192 24x16384 12x16384 8x16384 16x4096 24x4096:HND:4'
p fw90 d256f8 --head_dim=256 --fp8 $F8
p main90 d256f8 --head_dim=256 --fp8 $F8
p main90 d256bf --head_dim=256 24x4096 24x8192 12x16384 8x16384 16x4096
p main90 d64f8 --head_dim=64 --fp8 1x32768 1x32768:HND:48 1x32768:HND:64
p main90 d64f8b --head_dim=64 --fp8 --page_size=64 1x32768 1x32768:HND:48 1x32768:HND:64
log "probes done"
T=$(left 570); log "replay, default mode (timeout ${T}s)"
PYTHONPATH=/tmp/ab/fw90 timeout $T python3 tools/replay/replay.py --device=cuda --max_requests=0 --check_every=100 \
  --noprogress > $OUT/r/replay.txt 2>&1
echo "rc=$?" >> $OUT/r/replay.txt; tail -8 $OUT/r/replay.txt | tee -a $OUT/log.txt
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
