#!/usr/bin/env bash
# Session 50 call 5: h62 (= main ba37e87's kernels: the fp8 tiles' log2-unit logits, the
# 256-key d64 fp8 tiles at 3 stages): the whole GPU suite, compute-sanitizer memcheck over
# tools/gpu/sanitizer_cases.py, then the d64 fp8 bench rows beside bf16 if time is left.
source tools/gpu/call_lib.sh .device_run64/k6.tar.xz
mkdir -p $OUT/r
gpu_tests h62; cp $OUT/pytest_h62.log $OUT/r/
sanitize h62 memcheck; cp $OUT/sanitizer_memcheck.log $OUT/r/
T=$(left 230)
if (( T > 40 )); then
  PYTHONPATH=/tmp/ab/h62:$PWD/tests/python:$PWD timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full \
    --noflex --max_gather_gb=0 --plot=false --only='^decode (24 x 4096|1 x 32768) d64$' \
    --time_budget_s=$(( T - 10 )) --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
  log "bench rc=$?"; grep "splitkv fp8" $OUT/r/fp8/bench.md | cut -c1-200 >> $OUT/log.txt
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
