#!/usr/bin/env bash
# Session 48 call 2 (minimal: the device budget went to failed starts), on ca90 (= main's
# kernels): the transformers GPU tests with the near-tie allowance measured on the card, and
# the C++ launcher alone once (launcher_bench 20000 cuda).
source tools/gpu/call_lib.sh .device_run48/k4.tar.xz
mkdir -p $OUT/r
export PYTHONPATH=/tmp/ab/ca90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "transformers gpu tests"
timeout 120 python3 -m pytest tests/python/transformers_integration_test.py -m gpu -q -rs -s \
  -p no:cacheprovider > $OUT/r/transformers_gpu.txt 2>&1
log "pytest rc=$?"; grep -E "tie allowance|vs paged|passed|failed|Error" $OUT/r/transformers_gpu.txt | tee -a $OUT/log.txt
xz -dc .device_run48/launcher_bench.xz > /tmp/launcher_bench && chmod +x /tmp/launcher_bench
timeout 30 /tmp/launcher_bench 20000 cuda > $OUT/r/launcher_bench.txt 2>&1
tail -8 $OUT/r/launcher_bench.txt | tee -a $OUT/log.txt
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
