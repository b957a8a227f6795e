#!/usr/bin/env bash
# Stop 51: head_dim 64 prefill without ping-pong, lazy max (v1) or not (v2).
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
tar xJf .device_run/three.tar.xz
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
for round in 1 2; do
  for pkg in P v1 v2; do
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 1x16384 4x4096 8x2048 trace 64x256 >> $R/pf64_$pkg.txt 2>&1
    stamp "d64 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf64_$pkg.txt | tail -n 5 | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
for pkg in P v1; do
  PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --invariant --head_dim=64 4x4096 trace > $R/inv64_$pkg.txt 2>&1
  stamp "d64 invariant $pkg rc=$? | $(grep TFLOP $R/inv64_$pkg.txt | awk '{print $2, $5}' | tr '\n' ' ')"
done
for pkg in ${TEST_PKGS:-v1 v2}; do
  PYTHONPATH=$PWD/$pkg/.device:$PWD/tests/python:$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/sinks_test.py tests/python/batch_invariant_test.py > $R/tests_$pkg.log 2>&1
  stamp "$pkg prefill tests rc=$? | $(tail -n 1 $R/tests_$pkg.log)"
done
cp -r $R/. $OUT/
