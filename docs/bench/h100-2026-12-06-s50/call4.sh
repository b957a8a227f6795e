#!/usr/bin/env bash
# Session 50 call 4: e62 (head_dim 64 fp8 keys-as-rows tiles at 3 stages: 128-key blocks 4 an
# SM, 256-key blocks 2 an SM) against l62 (= main 8bc656f's kernels): the fp8 / cuda GPU tests on
# e62, then decode_profile --time --fp8 --head_dim=64 rows alternated l62 / e62 / e62 / l62 at
# page 16 and 64; on an H200 also the ring-4 A/B (m61 / r4) and the fp8 bench rows on l62.
source tools/gpu/call_lib.sh .device_run63/k5.tar.xz
mkdir -p $OUT/r
PYTHONPATH=/tmp/ab/e62:tests/python timeout 120 python3 -m pytest tests/python/fp8_kv_test.py \
  tests/python/cuda_backend_test.py tests/python/kv_positions_test.py -m gpu -q -rs -p no:cacheprovider \
  > $OUT/r/pytest_e62.log 2>&1
log "pytest e62 rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_e62.log | head -20 | tee -a $OUT/log.txt
tail -1 $OUT/r/pytest_e62.log | tee -a $OUT/log.txt
SHAPES="24x4096 24x8192 64x4096 16x4096 8x8192 4x16384 1x32768 1x131072"
for pkg in l62 e62 e62 l62; do
  for page in 16 64; do
    echo "-- $pkg p$page" >> $OUT/r/ab.txt
    PYTHONPATH=/tmp/ab/$pkg:$PWD timeout 60 python3 tools/gpu/decode_profile.py --time --fp8 --head_dim=64 \
      --page_size=$page $SHAPES > $OUT/r/ab_part.txt 2>&1
    tail -8 $OUT/r/ab_part.txt >> $OUT/r/ab.txt
  done
  log "ab $pkg"
done
cat $OUT/r/ab.txt >> $OUT/log.txt
if on_h200; then
  inv m61 128 1; inv r4 128 1
  log "ring4 A/B done"; cp $OUT/inv128.txt $OUT/r/; cat $OUT/inv128.txt >> $OUT/log.txt
  source tools/gpu/install_peers.sh .device_run63/peers.tar.xz > $OUT/r/peers.txt 2>&1
  T=$(left 570)
  if (( T > 60 )); then
    PYTHONPATH=/tmp/ab/l62:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout $T python3 tools/bench/bench.py \
      --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
      --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( T - 20 )) \
      --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
    log "bench rc=$?"
  fi
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
