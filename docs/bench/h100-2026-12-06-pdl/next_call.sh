#!/usr/bin/env bash
# Session 47 ran its parts as ../h100-2026-12-06-s47/c1.sh and c3.sh (no H200 came, so not the ring A/B).
# For the next device call (written in session 46; not run). Packages in .device_run/kn.tar.xz:
#   main90  main at or after f065d6a (PDL, inputs through LoadInput), built with
#           tools/gpu/build_package.sh and checked first with tools/gpu/sass_pdl_check.py;
#   old90   1259e89 (before PDL);
#   ring90  main90's commit + ../sass-2026-12-06-decode-s-ahead/decode_s_ahead_d128_ring4.patch
#           (applies to f065d6a).
# (1) every GPU test and compute-sanitizer on main90 (f065d6a never ran on a GPU);
# (2) the PDL + LoadInput A/B against old90: bench short_splits decode rows and quick's short
#     decode rows, no peers, alternating, two rounds, then ragged prefill (prefill_profile.py);
# (3) on an H200 only: the d128 invariant ring A/B (callz8.sh's first half).
# Everything goes into $OUT/r.tar.xz: the device returns few files.
# carry: [".device_run/kn.tar.xz", ".device_run/next_call.sh"]
source tools/gpu/call_lib.sh .device_run/kn.tar.xz
mkdir -p $OUT/r
gpu_tests main90
sanitize main90 memcheck racecheck synccheck
b() { # b PACKAGE PRESET ONLY TAG
  (( $(left 520) > 40 )) || { log "skip $4: time"; return; }
  PYTHONPATH=/tmp/ab/$1:$PWD/tests/python:$PWD timeout $(left 540) python3 tools/bench/bench.py --device=cuda \
    --shapes=$2 --noflex --max_gather_gb=0 --noserving_peers --only="$3" --plot=false --out_dir=$OUT/r/$4 > $OUT/r/$4.log 2>&1
  echo "bench $4 rc=$?" | tee -a $OUT/log.txt
}
Q='^decode (16 x (4096|8192)|1 x 32768) d128$'
for r in 1 2; do
  for pkg in old90 main90; do b $pkg short_splits '^decode' short_${pkg}_$r; b $pkg quick "$Q" quick_${pkg}_$r; done
done
for pkg in old90 main90 main90 old90; do
  (( $(left 520) > 40 )) || break
  echo "-- $pkg" >> $OUT/r/prefill.txt
  PYTHONPATH=/tmp/ab/$pkg timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 1x16384 4x4096 8x2048 trace \
    >> $OUT/r/prefill.txt 2>&1
done
if on_h200; then
  log "d128 invariant ring A/B"; inv main90 128 1; inv ring90 128 1; inv ring90 128 2; inv main90 128 2
  cp $OUT/inv128.txt $OUT/r/
fi
log done
cp $OUT/log.txt $OUT/pytest_*.log $OUT/sanitizer_*.log $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
