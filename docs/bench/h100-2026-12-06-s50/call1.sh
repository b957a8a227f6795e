#!/usr/bin/env bash
# Session 50 call 1 (ran first; the H200 call c1.sh had found no machine): l62 (fp8 decode tiles with log2-unit logits, FastExp2, the soft cap's
# branch a block) against m61 (main's kernels): the fp8 / cuda GPU tests on l62, then
# decode_profile --time --fp8 rows alternated m61 / l62 / l62 / m61 at head_dim 64, 128, 256.
source tools/gpu/call_lib.sh .device_run62/k4.tar.xz
mkdir -p $OUT/r
PYTHONPATH=/tmp/ab/l62:tests/python timeout 150 python3 -m pytest tests/python/fp8_kv_test.py \
  tests/python/cuda_backend_test.py tests/python/kv_positions_test.py -m gpu -q -rs -p no:cacheprovider \
  > $OUT/r/pytest_l62.log 2>&1
log "pytest l62 rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_l62.log | head -20 | tee -a $OUT/log.txt
tail -1 $OUT/r/pytest_l62.log | tee -a $OUT/log.txt
n=0
for pkg in m61 l62 l62 m61; do
  n=$((n + 1))
  for hd in 64 128 256; do
    echo "-- $n $pkg d$hd" >> $OUT/r/ab.txt
    PYTHONPATH=/tmp/ab/$pkg:$PWD timeout 40 python3 tools/gpu/decode_profile.py --time --fp8 --head_dim=$hd \
      24x4096 24x8192 64x4096 1x32768 > $OUT/r/ab_part.txt 2>&1
    tail -4 $OUT/r/ab_part.txt >> $OUT/r/ab.txt
  done
  log "ab $n $pkg"
done
cat $OUT/r/ab.txt >> $OUT/log.txt
T=$(left 560)
if (( T > 40 )); then
  for pkg in m61 l62; do
    PYTHONPATH=/tmp/ab/$pkg:$PWD timeout 30 python3 tools/gpu/decode_profile.py --time --head_dim=64 \
      24x4096 1x32768 >> $OUT/r/bf16.txt 2>&1
  done
  log "bf16 d64 rows"; tail -4 $OUT/r/bf16.txt >> $OUT/log.txt
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
