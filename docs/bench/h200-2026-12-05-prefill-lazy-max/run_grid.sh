#!/usr/bin/env bash
# Stop 51: the final package (E): the GPU suite, then the prefill rows of the bench beside the peers.
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
mkdir -p E && tar xJf .device_run/exp.tar.xz -C E
export PYTHONUNBUFFERED=1
OUT=$R/chk SPLITKV_DEVICE_DIR=E/.device timeout 360 bash tools/gpu/run_checks.sh smoke tests > $R/checks.log 2>&1
stamp "run_checks rc=$? | $(tail -n 3 $R/checks.log | tr '\n' ' ')"
grep -E "^(FAILED|ERROR)" $R/chk/pytest.log | head -20
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
left=$(( 560 - ($(date +%s) - t0) - 40 ))
stamp "bench budget ${left}s"
timeout $(( left + 35 )) python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^prefill .*' --time_budget_s=$left --out_dir=$R/grid > $R/bench.log 2>&1
stamp "bench rc=$?"
tail -n 60 $R/grid/bench.md 2>/dev/null | grep -i -E "prefill|behind|ahead" | head -40
cp $R/summary.txt $R/checks.log $R/bench.log $OUT/ 2>/dev/null; cp $R/chk/pytest.log $OUT/ 2>/dev/null
cp -r $R/grid $OUT/grid 2>/dev/null
