#!/usr/bin/env bash
# Stop 52: the bench's prefill rows beside the peers on E (0139c73).
# carry: [".device_run/e.tar.xz", ".device_run/callG.sh", ".device_peers/peers3.tar.xz"]
set -u
rm -rf /tmp/res; R=/tmp/res; mkdir -p $R
[ -d E ] || (xz -dc .device_run/e.tar.xz | tar xf -)
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > $R/peers.log 2>&1
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^prefill .*' --time_budget_s=150 --out_dir=$R/grid > $R/bench.log 2>&1
echo "bench rc=$?"
mkdir -p $OUT/G; cp -r $R/. $OUT/G/
