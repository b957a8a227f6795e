#!/usr/bin/env bash
# Session 48 call 1, on ca90 (= main's kernels and planner; this session changed no kernel):
# (1) the transformers GPU tests with the near-tie allowance measured on the card;
# (2) the whole gpt-oss-20b trace over an fp8 cache (issue 17), first run since PDL / ld.ca.
source tools/gpu/call_lib.sh .device_run48/k4.tar.xz
mkdir -p $OUT/r
export PYTHONPATH=/tmp/ab/ca90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "transformers gpu tests"
timeout 150 python3 -m pytest tests/python/transformers_integration_test.py -m gpu -q -rs -s \
  -p no:cacheprovider > $OUT/r/transformers_gpu.txt 2>&1
log "pytest rc=$?"; grep -E "tie allowance|vs paged|passed|failed" $OUT/r/transformers_gpu.txt | tee -a $OUT/log.txt
T=$(left 575)
log "gpt-oss-20b fp8 replay (timeout ${T}s)"
timeout $T python3 tools/replay/replay.py --device=cuda --model=gpt-oss-20b --kv_dtype=fp8_e4m3 \
  --max_requests=0 --check_every=200 --noprogress > $OUT/r/replay_gptoss_fp8.txt 2>&1
echo "rc=$?" >> $OUT/r/replay_gptoss_fp8.txt; tail -14 $OUT/r/replay_gptoss_fp8.txt | tee -a $OUT/log.txt
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
