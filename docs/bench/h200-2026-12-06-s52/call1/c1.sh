#!/usr/bin/env bash
# Session 52 call 1: h64 (main f0dcb9b, not yet run on a GPU) and h65 (h64 + 16-byte fp8 copy
# loads, one chunk a thread). Tests, per-kernel profile of fp8 vs bf16 prefill on both, prefill
# bench rows on h65, sanitizer; on an H200 also issue 15's host table, fp8 decode rows, d128
# prefill rows beside the peers.
source tools/gpu/call_lib.sh .device_run66/k1.tar.xz
mkdir -p $OUT/r
PYTHONPATH=/tmp/ab/h64:tests/python timeout 100 python3 -m pytest tests/python/fp8_kv_test.py tests/python/layout_test.py \
  -m gpu -q -rs -p no:cacheprovider > $OUT/r/pytest_fp8_h64.log 2>&1
log "h64 fp8+layout tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_fp8_h64.log | head; tail -1 $OUT/r/pytest_fp8_h64.log | tee -a $OUT/log.txt
for pkg in h64 h65; do
  PYTHONPATH=/tmp/ab/$pkg timeout 60 python3 .device_run66/prof.py > $OUT/r/prof_$pkg.txt 2>&1
  log "prof $pkg rc=$?"
done
grep -E "copy|Stage|Prefill" $OUT/r/prof_h6*.txt | cut -c1-140 >> $OUT/log.txt
gpu_tests h65; cp $OUT/pytest_h65.log $OUT/r/
PYTHONPATH=/tmp/ab/h65:$PWD/tests/python:$PWD timeout 80 python3 tools/bench/bench.py --device=cuda --shapes=full \
  --noflex --max_gather_gb=0 --plot=false --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d128$' \
  --time_budget_s=65 --out_dir=$OUT/r/pre > $OUT/r/pre.log 2>&1
log "prefill bench rc=$?"; grep "splitkv" $OUT/r/pre/bench.md | cut -c1-150 >> $OUT/log.txt
sanitize h65 memcheck racecheck; cp $OUT/sanitizer_*.log $OUT/r/
if on_h200 && (( $(left 560) > 150 )); then
  source tools/gpu/install_peers.sh .device_run62/peers.tar.xz > $OUT/r/peers.txt 2>&1
  export PYTHONPATH=/tmp/ab/h65:$PWD/tests/python:$PWD:${PYTHONPATH:-}
  timeout 90 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
  log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
  T=$(left 400)
  if (( T > 60 )); then
    timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
      --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( T - 20 )) \
      --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
    log "fp8 decode bench rc=$?"
  fi
  T=$(left 565)
  if (( T > 60 )); then
    timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
      --only='^prefill (4 x 4096|8 x 2048) d128$' --time_budget_s=$(( T - 15 )) --out_dir=$OUT/r/prepeers \
      > $OUT/r/prepeers.log 2>&1
    log "prefill+peers bench rc=$?"
  fi
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
