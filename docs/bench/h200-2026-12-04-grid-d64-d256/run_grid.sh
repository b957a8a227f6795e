#!/usr/bin/env bash
# The head_dim 64 and 256 decode grids beside FlashInfer (package v: main + the wave-split rule)
set -u
mkdir -p B && tar xJf .device_run/v.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/peers > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 575 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode .* d(64|256)$' --time_budget_s=500 --out_dir=$OUT/grid > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -3 $OUT/bench.log
