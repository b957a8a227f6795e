#!/usr/bin/env bash
# For the next stop (built 2026-12-05, stop 51): next.tar.xz holds P (8b29db9: two consumers at
# d64), T (d020da1, main: three consumers at d64), I (branch exp/d64-invariant-three-consumers:
# invariant d64 prefill on three consumers too). H200: A/B P vs T, I's bitwise tests, the
# invariant cost on T and I, the trace row's eager figure on P and T, then (REPLAY_END=585) the
# whole gpt-oss-20b fp8 trace on T.  carry: [".device_run/next.tar.xz", ".device_run/callNext.sh"]
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
tar xJf .device_run/next.tar.xz
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
for round in 1 2; do
  for pkg in P T; do
    PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 40 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=64 1x16384 4x4096 8x2048 trace >> $R/pf64_$pkg.txt 2>&1
    stamp "d64 $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf64_$pkg.txt | tail -n 4 | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
PYTHONPATH=$PWD/I/.device:$PWD/tests/python:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/batch_invariant_test.py tests/python/prefill_sm90_test.py tests/python/paged_prefill_sm90_test.py > $R/tests_I.log 2>&1
stamp "I tests rc=$? | $(tail -n 1 $R/tests_I.log)"
for pkg in T I; do
  PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/bench/invariant_cost.py --device=cuda --head_dim=64 --kinds=prefill --rounds=3 > $R/inv_$pkg.txt 2>&1
  stamp "invariant cost d64 prefill $pkg rc=$? | $(tail -n 5 $R/inv_$pkg.txt | tr '\n' ' ')"
done
for pkg in P T; do
  PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 50 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --only='^prefill trace.* d64$' --time_budget_s=30 --out_dir=$R/g_$pkg > $R/b_$pkg.log 2>&1
  stamp "bench trace $pkg rc=$? | $(grep -E '^\| prefill .* \| splitkv( paged)? \|' $R/g_$pkg/bench.md | cut -d'|' -f5,6,8,9 | tr '\n' ' ')"
done
left=$(( ${REPLAY_END:-0} - ($(date +%s) - t0) ))
if [ $left -ge 420 ]; then
  PYTHONPATH=$PWD/T/.device:$PWD/tests/python:$PWD timeout $left python3 tools/replay/replay.py --device=cuda \
    --model=gpt-oss-20b --kv_dtype=fp8_e4m3 --max_requests=0 --check_every=200 > $R/replay_fp8_gptoss.log 2>&1
  stamp "replay rc=$? | $(tail -n 4 $R/replay_fp8_gptoss.log | tr '\n' ' ')"
else
  stamp "no replay (${left}s left; it took 384 s on an H100)"
fi
cp -r $R/. $OUT/ 2>/dev/null
