#!/usr/bin/env bash
# Stop 52: the prefill epilogue's rows staged in shared memory for 16-byte stores (E) against
# main (M, c054c0f): E's GPU tests on the prefill paths, then graph TFLOP/s A/B at d128 / 64 / 256.
# carry: [".device_run/me.tar.xz", ".device_run/callE.sh"]
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
xz -dc .device_run/me.tar.xz | tar xf -
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -x \
  tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/batch_invariant_test.py \
  tests/python/sinks_test.py tests/python/out_argument_test.py tests/python/ragged_attention_test.py > $R/tests_E.log 2>&1
stamp "E tests rc=$? | $(tail -n 1 $R/tests_E.log)"
grep -E "^(FAILED|ERROR)" $R/tests_E.log | head -5 | tee -a $S
for round in 1 2; do
  for d in 128 64 256; do
    for pkg in M E; do
      PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$d 1x16384 4x4096 8x2048 trace 64x256 >> $R/pf${d}_$pkg.txt 2>&1
      stamp "d$d $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf${d}_$pkg.txt | tail -n 5 | awk '{print $2, $5}' | tr '\n' ' ')"
    done
  done
done
cp -r $R/. $OUT/ 2>/dev/null
