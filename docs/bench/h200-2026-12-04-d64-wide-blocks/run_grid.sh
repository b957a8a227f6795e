#!/usr/bin/env bash
# package u4: the d64 decode grid beside FlashInfer
set -u
mkdir -p B && tar xJf .device_run/u4.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 560 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode .* d64$' --time_budget_s=500 --out_dir=$OUT/grid > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -3 $OUT/bench.log
