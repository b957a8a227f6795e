#!/usr/bin/env bash
# Device call 2 (session 45): exp/d128-default-wgmma-order (wo128_90: default-mode head_dim 128
# paged decode grids past one wave of split CTAs on the wgmma-order tiles, as head_dim 64's).
# (1) every GPU test on it; (2) decode_profile.py A/B against main af012ea (cur90), inputs of at
# most ~1 GB (larger ones moved 15-20 % from process to process in call 1), pages 16 and 64,
# alternated; (3) compute-sanitizer memcheck and racecheck on tools/gpu/sanitizer_cases.py.
# carry: [".device_run/ab.tar.xz", ".device_run/c2.sh"]
source tools/gpu/call_lib.sh .device_run/ab.tar.xz
log "pytest -m gpu (wo128_90)"
PYTHONPATH=/tmp/ab/wo128_90:tests/python timeout 330 python3 -m pytest tests/python -m gpu -q -rs -p no:cacheprovider \
  > $OUT/pytest_wo128.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; tail -4 $OUT/pytest_wo128.log | tee -a $OUT/log.txt
SHAPES="64x1024 256x1024 64x2048 256x2048 64x4096 32x8192 16x4096"
ab() { echo "-- $1 p$2" >> $OUT/ab.txt
  PYTHONPATH=/tmp/ab/$1 timeout 50 python3 tools/gpu/decode_profile.py --time --page_size=$2 $SHAPES > $OUT/ab_part.txt 2>&1
  tail -n $(echo $SHAPES | wc -w) $OUT/ab_part.txt >> $OUT/ab.txt; }
log "A/B"
ab cur90 16; ab wo128_90 16; ab wo128_90 64; ab cur90 64; ab cur90 64; ab wo128_90 64; ab wo128_90 16; ab cur90 16
cat $OUT/ab.txt | tee -a $OUT/log.txt
for tool in memcheck racecheck; do
  T=$(left 585); (( T > 40 )) || break
  log "compute-sanitizer $tool (timeout ${T}s)"
  PYTHONPATH=/tmp/ab/wo128_90:tests/python timeout $T compute-sanitizer --tool $tool --error-exitcode 9 \
    --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > $OUT/sanitizer_$tool.log 2>&1
  echo "$tool rc=$?" | tee -a $OUT/log.txt; grep -E "SUMMARY" $OUT/sanitizer_$tool.log | tee -a $OUT/log.txt
done
log done
