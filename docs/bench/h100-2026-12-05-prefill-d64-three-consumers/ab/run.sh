#!/usr/bin/env bash
# Stop 51: head_dim 64 prefill on three consumer warpgroups (T) against HEAD (P); T's prefill
# tests; then the whole gpt-oss-20b fp8 trace (issue 17) on T if its tests passed, else on P.
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
tar xJf .device_run/three.tar.xz P && mkdir -p T && tar xJf .device_run/t.tar.xz -C T
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader)"
for round in 1 2; do
  for pkg in P T; do
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 1x16384 4x4096 8x2048 trace 64x256 >> $R/pf64_$pkg.txt 2>&1
    stamp "d64 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf64_$pkg.txt | tail -n 5 | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
PYTHONPATH=$PWD/T/.device:$PWD/tests/python:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py tests/python/sinks_test.py tests/python/batch_invariant_test.py > $R/tests_T.log 2>&1
rc=$?
stamp "T prefill tests rc=$rc | $(tail -n 1 $R/tests_T.log)"
grep -E "^(FAILED|ERROR)" $R/tests_T.log | head -10
RP=P; [ $rc = 0 ] && RP=T
export PYTHONPATH=$PWD/$RP/.device:$PWD/tests/python:$PWD
left=$(( ${REPLAY_END:-0} - ($(date +%s) - t0) ))
[ $left -lt 300 ] && { stamp "no replay (${left}s)"; cp -r $R/. $OUT/; exit 0; }
stamp "replay on $RP, ${left}s left"
timeout $left python3 tools/replay/replay.py --device=cuda --model=gpt-oss-20b --kv_dtype=fp8_e4m3 \
  --max_requests=0 --check_every=200 > $R/replay_fp8_gptoss.log 2>&1
stamp "replay rc=$? | $(tail -n 4 $R/replay_fp8_gptoss.log | tr '\n' ' ')"
cp -r $R/. $OUT/
