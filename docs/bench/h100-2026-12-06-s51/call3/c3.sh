#!/usr/bin/env bash
# Session 51 call 3: f3 (main 502a304: fp8 prefill through a 16-bit copy of its K/V in the
# workspace on the wgmma kernel): the fp8 GPU tests, the whole GPU suite, the prefill bench rows
# (bf16 and fp8 side by side, ragged and paged), compute-sanitizer memcheck; on an H200 also
# host time per call beside FlashInfer (issue 15) and the fp8 decode rows (issue 17).
source tools/gpu/call_lib.sh .device_run65/k3.tar.xz
mkdir -p $OUT/r
PYTHONPATH=/tmp/ab/f3:tests/python timeout 100 python3 -m pytest tests/python/fp8_kv_test.py -m gpu -q -rs \
  -p no:cacheprovider -x > $OUT/r/pytest_fp8.log 2>&1
log "fp8 tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_fp8.log | head; tail -1 $OUT/r/pytest_fp8.log | tee -a $OUT/log.txt
PYTHONPATH=/tmp/ab/f3:$PWD/tests/python:$PWD timeout 150 python3 tools/bench/bench.py --device=cuda --shapes=full \
  --noflex --max_gather_gb=0 --plot=false --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d(64|128|256)$' \
  --time_budget_s=130 --out_dir=$OUT/r/pre > $OUT/r/pre.log 2>&1
log "prefill bench rc=$?"; grep "splitkv" $OUT/r/pre/bench.md | cut -c1-150 >> $OUT/log.txt
gpu_tests f3; cp $OUT/pytest_f3.log $OUT/r/
sanitize f3 memcheck; cp $OUT/sanitizer_memcheck.log $OUT/r/
if on_h200 && (( $(left 560) > 150 )); then
  source tools/gpu/install_peers.sh .device_run62/peers.tar.xz > $OUT/r/peers.txt 2>&1
  export PYTHONPATH=/tmp/ab/f3:$PWD/tests/python:$PWD:${PYTHONPATH:-}
  timeout 90 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
  log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
  T=$(left 570)
  if (( T > 60 )); then
    timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
      --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( T - 20 )) \
      --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
    log "bench rc=$?"
  fi
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
