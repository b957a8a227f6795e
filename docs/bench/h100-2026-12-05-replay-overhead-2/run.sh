#!/usr/bin/env bash
# Stop 52, H200: whole gpt-oss-20b fp8 trace replay (issue 17), host time beside FlashInfer
# (issue 15), then the prefill rows of the bench beside the peers (issue 18). carry:
# [".device_run/pkgA.tar.xz", ".device_run/callA.sh", ".device_peers/peers3.tar.xz"]
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
tar xJf .device_run/pkgA.tar.xz
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader)"
PYTHONPATH=$PWD/.device:$PWD/tests/python:$PWD timeout 400 python3 tools/replay/replay.py --device=cuda \
  --model=gpt-oss-20b --kv_dtype=fp8_e4m3 --max_requests=0 --check_every=200 > $R/replay_fp8_gptoss.log 2>&1
stamp "replay rc=$? | $(tail -n 4 $R/replay_fp8_gptoss.log | tr '\n' ' ')"
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1
export PYTHONPATH=$PWD/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 60 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$R/overhead > $R/overhead.log 2>&1
stamp "overhead rc=$? | $(grep -E 'interleaved|x$' $R/overhead.log | tail -n 3 | tr '\n' ' ')"
left=$(( 575 - ($(date +%s) - t0) - 25 ))
stamp "bench budget ${left}s"
if [ $left -ge 40 ]; then
  timeout $(( left + 20 )) python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --only='^prefill .*' --time_budget_s=$left --out_dir=$R/grid > $R/bench.log 2>&1
  stamp "bench rc=$?"
fi
cp -r $R/. $OUT/ 2>/dev/null
