#!/usr/bin/env bash
# Stop 51: T (three consumer warpgroups at head_dim 64): GPU suite, then the d64 prefill rows beside the peers.
set -u
R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
mkdir -p T && tar xJf .device_run/t.tar.xz -C T
export PYTHONUNBUFFERED=1
OUT=$R/chk SPLITKV_DEVICE_DIR=T/.device timeout 200 bash tools/gpu/run_checks.sh smoke tests > $R/checks.log 2>&1
stamp "run_checks rc=$? | $(tail -n 3 $R/checks.log | tr '\n' ' ')"
grep -E "^(FAILED|ERROR)" $R/chk/pytest.log | head -20
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1
export PYTHONPATH=$PWD/T/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 110 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^prefill .* d64$' --time_budget_s=80 --out_dir=$R/grid > $R/bench.log 2>&1
stamp "bench rc=$?"
grep -E "^\| prefill .* d64 \| bfloat16 \| - \|" $R/grid/bench.md | cut -d'|' -f3,6,7,8,9,12,13,14,15
cp $R/summary.txt $R/checks.log $R/bench.log $OUT/ 2>/dev/null; cp $R/chk/pytest.log $OUT/ 2>/dev/null
cp -r $R/grid $OUT/grid 2>/dev/null
