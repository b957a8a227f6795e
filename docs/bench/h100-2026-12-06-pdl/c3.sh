#!/usr/bin/env bash
# Device call 3 (session 46): where programmatic dependent launch pays. main90 (1259e89),
# pdl90 (PDL, LaunchDependents after each kernel's main loop), pdlx90 (PDL, no explicit
# trigger: the next grid is released as this one's CTAs exit). Call 2 saw pdl90 4-6 % slower
# on one-wave split grids (16 x 4096, 16 x 8192), a guess: the next grid's CTAs are placed
# early onto whichever SMs have room. (1) the chain and graph tests on pdlx90; (2) bench,
# no peers, alternating: short_splits decode rows and quick's 16 x 4096 / 16 x 8192 / 1 x 32768;
# (3) short_splits with the peers on pdlx90. All results in $OUT/r.tar.xz (the device returns
# few files).
# carry: [".device_run/k3.tar.xz", ".device_run/peers.tar.xz", ".device_run/c3.sh"]
source tools/gpu/call_lib.sh .device_run/k3.tar.xz
mkdir -p $OUT/r
log "chain + graph tests (pdlx90)"
PYTHONPATH=/tmp/ab/pdlx90:tests/python timeout 120 python3 -m pytest tests/python/cuda_backend_test.py -q -p no:cacheprovider \
  -k "back_to_back or cuda_graph" > $OUT/r/pytest_pdlx90.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; tail -1 $OUT/r/pytest_pdlx90.log | tee -a $OUT/log.txt
b() { # b PACKAGE PRESET ONLY TAG [more flags]
  (( $(left 560) > 40 )) || { log "skip $4: time"; return; }
  log "bench $4"
  PYTHONPATH=/tmp/ab/$1:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout $(left 570) python3 tools/bench/bench.py \
    --device=cuda --shapes=$2 --noflex --max_gather_gb=0 --only="$3" --plot=false --out_dir=$OUT/r/$4 "${@:5}" > $OUT/r/$4.log 2>&1
  echo "bench $4 rc=$?" | tee -a $OUT/log.txt
}
Q='^decode (16 x (4096|8192)|1 x 32768) d128$'
for r in 1 2; do
  for pkg in main90 pdl90 pdlx90; do
    b $pkg short_splits '^decode' short_${pkg}_$r --noserving_peers
    b $pkg quick "$Q" quick_${pkg}_$r --noserving_peers
  done
done
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/r/peers.txt 2>&1
b pdlx90 short_splits '^decode' short_pdlx90_peers
b main90 short_splits '^decode' short_main90_peers
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
