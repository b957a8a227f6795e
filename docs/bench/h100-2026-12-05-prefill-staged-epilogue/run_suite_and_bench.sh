#!/usr/bin/env bash
# Stop 52: E (the staged 16-byte epilogue) through the whole GPU suite, then the bench's prefill
# rows beside the peers. carry: [".device_run/e.tar.xz", ".device_run/callF.sh", ".device_peers/peers3.tar.xz"]
set -u
rm -rf /tmp/res; R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
[ -d E ] || (xz -dc .device_run/e.tar.xz | tar xf -)
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
OUT=$R/chk SPLITKV_DEVICE_DIR=E/.device timeout 330 bash tools/gpu/run_checks.sh smoke tests > $R/checks.log 2>&1
stamp "run_checks rc=$? | $(tail -n 3 $R/checks.log | tr '\n' ' ')"
grep -E "^(FAILED|ERROR)" $R/chk/pytest.log | head -20 | tee -a $S
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
left=$(( 575 - ($(date +%s) - t0) - 25 ))
stamp "bench budget ${left}s"
if [ $left -ge 60 ]; then
  timeout $(( left + 20 )) python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --only='^prefill .*' --time_budget_s=$left --out_dir=$R/grid > $R/bench.log 2>&1
  stamp "bench rc=$?"
fi
mkdir -p $OUT/F; cp $R/summary.txt $R/checks.log $R/bench.log $OUT/F/ 2>/dev/null; cp $R/chk/pytest.log $OUT/F/ 2>/dev/null
cp -r $R/grid $OUT/F/grid 2>/dev/null
