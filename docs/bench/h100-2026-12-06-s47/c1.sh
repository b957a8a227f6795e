#!/usr/bin/env bash
# Session 47 call 1: main90 = 09b9171 (f065d6a's kernels: PDL + LoadInput, plus a host-side
# refactor of the shared-memory opt-in); none of it ran on a GPU yet. (1) GPU tests + sanitizers; (2) LoadInput A/B vs old90
# (1259e89, before PDL): short_splits decode + prefill_profile; (3) fp8 vs bf16 forced-split
# probes at the fp8 cells that miss issue 17's ratio (d256 / d64 batch 24, 1 x 32768).
source tools/gpu/call_lib.sh .device_run/k1.tar.xz
mkdir -p $OUT/r
gpu_tests main90
sanitize main90 memcheck racecheck synccheck
b() { # b PACKAGE PRESET ONLY TAG
  (( $(left 540) > 40 )) || { log "skip $4: time"; return; }
  PYTHONPATH=/tmp/ab/$1:$PWD/tests/python:$PWD timeout 60 python3 tools/bench/bench.py --device=cuda \
    --shapes=$2 --noflex --max_gather_gb=0 --noserving_peers --only="$3" --plot=false --out_dir=$OUT/r/$4 > $OUT/r/$4.log 2>&1
  log "bench $4 rc=$?"
}
b old90 short_splits '^decode' short_old90_1; b main90 short_splits '^decode' short_main90_1
for pkg in old90 main90; do
  echo "-- $pkg" >> $OUT/r/prefill.txt
  PYTHONPATH=/tmp/ab/$pkg timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 1x16384 4x4096 8x2048 trace \
    >> $OUT/r/prefill.txt 2>&1
done
log "prefill done"
p() { # p TAG ARGS...: decode_profile rows
  local tag=$1; shift
  (( $(left 560) > 30 )) || { log "skip $tag: time"; return; }
  echo "-- $tag" >> $OUT/r/probe.txt
  PYTHONPATH=/tmp/ab/main90 timeout 60 python3 tools/gpu/decode_profile.py --time "$@" > $OUT/r/probe_part.txt 2>&1
  echo "rc=$?" >> $OUT/r/probe_part.txt; cat $OUT/r/probe_part.txt >> $OUT/r/probe.txt
}
p d256bf --head_dim=256 24x4096 24x16384
p d256f8 --head_dim=256 --fp8 24x4096 24x4096:HND:1 24x4096:HND:2 24x4096:HND:3 24x16384 24x16384:HND:2 24x16384:HND:4
p d64bf --head_dim=64 24x4096 24x8192 1x32768
p d64f8 --head_dim=64 --fp8 24x4096 24x4096:HND:1 24x4096:HND:2 24x4096:HND:3 24x4096:HND:4 24x8192 24x8192:HND:2 1x32768 1x32768:HND:16 1x32768:HND:24
p d128 --head_dim=128 1x32768
p d128f8 --head_dim=128 --fp8 1x32768 1x32768:HND:16 1x32768:HND:24
log done
cp $OUT/log.txt $OUT/pytest_*.log $OUT/sanitizer_*.log $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
