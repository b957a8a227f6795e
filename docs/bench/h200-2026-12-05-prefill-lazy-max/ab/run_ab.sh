#!/usr/bin/env bash
# Stop 51: lazy max in the default wgmma prefill (E) against main (P), then E's prefill tests.
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - t0 )) -gt ${1} ]; }
mkdir -p P E && tar xJf .device_run/pkg.tar.xz -C P && tar xJf .device_run/exp.tar.xz -C E
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
stamp "$(tail -n 1 $R/gpu.txt)"
if [ -f .device_peers/peers3.tar.xz ]; then source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1; fi
for round in 1 2; do
  for pkg in P E; do
    fa=--nofa3; [ $round = 1 ] && [ $pkg = P ] && fa=""
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time $fa 1x16384 4x4096 8x2048 trace 64x256 >> $R/pf_$pkg.txt 2>&1
    stamp "d128 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf_$pkg.txt | tail -n 5 | tr '\n' ' ')"
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 4x4096 trace >> $R/pf64_$pkg.txt 2>&1
    stamp "d64 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf64_$pkg.txt | tail -n 2 | tr '\n' ' ')"
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=256 4x4096 trace >> $R/pf256_$pkg.txt 2>&1
    stamp "d256 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf256_$pkg.txt | tail -n 2 | tr '\n' ' ')"
  done
done
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD
late 330 || { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/sinks_test.py tests/python/batch_invariant_test.py -x > $R/tests.log 2>&1
  stamp "E prefill tests rc=$? | $(tail -n 1 $R/tests.log)"; }
late 540 || { cuobjdump -res-usage -arch sm_90a E/.device/splitkv/_splitkv*.so 2>&1 | grep -A1 PrefillSm90 | grep -o "REG:[0-9]* STACK:[0-9]*\|LOCAL:[0-9]*" | sort | uniq -c > $R/res_usage.txt; stamp "res usage: $(cat $R/res_usage.txt | tr '\n' ' ')"; }
cp -r $R/. $OUT/
