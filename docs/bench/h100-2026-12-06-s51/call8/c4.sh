#!/usr/bin/env bash
# Session 51 call 8: f3 (main 502a304). On an H200: host time per call beside FlashInfer
# (issue 15's rows), the fp8 decode rows beside bf16 (issue 17), the d128 prefill rows (bf16
# and fp8) beside FlashInfer and FA3. On an H100: the gpt-oss-20b trace's first 8,000 requests over an fp8 cache.
source tools/gpu/call_lib.sh .device_run65/k3.tar.xz
mkdir -p $OUT/r
PYTHONPATH=/tmp/ab/f3:tests/python timeout 60 python3 -m pytest tests/python/fp8_kv_test.py tests/python/layout_test.py \
  -m gpu -q -rs -p no:cacheprovider -k "graph_replay or fp8_prefill" > $OUT/r/pytest_new.log 2>&1
log "new fp8 tests rc=$?"; tail -1 $OUT/r/pytest_new.log | tee -a $OUT/log.txt
if on_h200; then
  source tools/gpu/install_peers.sh .device_run62/peers.tar.xz > $OUT/r/peers.txt 2>&1
  export PYTHONPATH=/tmp/ab/f3:$PWD/tests/python:$PWD:${PYTHONPATH:-}
  timeout 60 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
  log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
  timeout 75 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=60 --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
  log "fp8 decode bench rc=$?"
  T=$(left 225)
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^prefill (4 x 4096|8 x 2048) d128$' --time_budget_s=$(( T - 15 )) --out_dir=$OUT/r/pre \
    > $OUT/r/pre.log 2>&1
  log "prefill bench rc=$?"
else
  PYTHONPATH=/tmp/ab/f3:$PWD timeout $(left 220) python3 tools/replay/replay.py --device=cuda --model=gpt-oss-20b \
    --kv_dtype=fp8_e4m3 --max_requests=8000 --check_every=100 > $OUT/r/replay_gptoss_fp8.txt 2>&1
  log "gpt-oss fp8 replay rc=$?"; tr '\r' '\n' < $OUT/r/replay_gptoss_fp8.txt | tail -20 >> $OUT/log.txt
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
