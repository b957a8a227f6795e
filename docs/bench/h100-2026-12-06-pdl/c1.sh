#!/usr/bin/env bash
# Device call 1 (session 46). main90 = main 1259e89. (1) every GPU test and compute-sanitizer
# memcheck/racecheck on main90 (a66da04's tests and sanitizer cases never ran on a GPU);
# (2) bench --shapes=short_splits beside FlashInfer (XQA's short-context lead: planner or kernel?);
# (3) on an H200 only: callz8's d128 invariant ring A/B (ring90) and default route (old90 = af012ea).
# carry: [".device_run/k1.tar.xz", ".device_run/peers.tar.xz", ".device_run/c1.sh"]
source tools/gpu/call_lib.sh .device_run/k1.tar.xz
log "pytest -m gpu (main90)"
PYTHONPATH=/tmp/ab/main90:tests/python timeout 240 python3 -m pytest tests/python -m gpu -q -rs -p no:cacheprovider \
  > $OUT/pytest_main90.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest_main90.log | head -20 | tee -a $OUT/log.txt
tail -2 $OUT/pytest_main90.log | tee -a $OUT/log.txt
for tool in memcheck racecheck; do
  log "compute-sanitizer $tool"
  PYTHONPATH=/tmp/ab/main90:tests/python timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
    --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > $OUT/sanitizer_$tool.log 2>&1
  echo "$tool rc=$?" | tee -a $OUT/log.txt; grep -E "SUMMARY" $OUT/sanitizer_$tool.log | tee -a $OUT/log.txt
done
log "peers"; source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/peers.txt 2>&1
T=$(left 400); log "bench short_splits (timeout ${T}s)"
PYTHONPATH=/tmp/ab/main90:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout $T python3 tools/bench/bench.py --device=cuda \
  --shapes=short_splits --noflex --max_gather_gb=0 --out_dir=$OUT/short > $OUT/short.log 2>&1
echo "bench rc=$?" | tee -a $OUT/log.txt; tail -3 $OUT/short.log
if on_h200 && [[ -d /tmp/ab/ring90 ]]; then
  log "d128 invariant A/B"; inv main90 128 1; inv ring90 128 1; inv ring90 128 2; inv main90 128 2
  grep -E "^-- |1 x 32768|8 x 4096" "$OUT/inv128.txt" | tee -a "$OUT/log.txt"
  SHAPES="64x1024 256x1024 64x2048 256x2048 64x4096 32x8192 16x4096"
  log "d128 default route A/B"
  for run in "old90 16" "main90 16" "main90 64" "old90 64" "old90 64" "main90 64" "main90 16" "old90 16"; do
    (( $(left 590) > 45 )) && dprof $run $SHAPES
  done
  tee -a "$OUT/log.txt" < "$OUT/dprof.txt"
fi
log done
