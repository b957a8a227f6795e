#!/usr/bin/env bash
# Device call 4 (session 45), main 8f1d7d7 (new90): the whole conversation trace as gpt-oss-20b
# (two layers a step: a 128-token window with sinks and full attention, 64 qo / 8 kv heads,
# head_dim 64) over an fp8 e4m3 cache with per-head scales, float64 checks every 200th call.
# carry: [".device_run/new.tar.xz", ".device_run/c4.sh"]
source tools/gpu/call_lib.sh .device_run/new.tar.xz
T=$(left 530); log "replay gpt-oss-20b fp8 (timeout ${T}s)"
PYTHONPATH=/tmp/ab/new90:$PWD timeout $T python3 tools/replay/replay.py --device=cuda --max_requests=0 \
  --model=gpt-oss-20b --kv_dtype=fp8_e4m3 --check_every=200 --noprogress > $OUT/replay_gptoss_fp8.txt 2>&1
echo "rc=$?" >> $OUT/replay_gptoss_fp8.txt; tail -16 $OUT/replay_gptoss_fp8.txt | tee -a $OUT/log.txt
log done
