#!/usr/bin/env bash
# package u6 (u4 + the d256 fill-wave rule): d256 probe of planned vs forced splits, d64 probe, GPU checks, d256 grid
set -u
mkdir -p B && tar xJf .device_run/u6.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
HD=256 SPLITS=1,2,3,4,8 PAGE=16 timeout 120 python3 .device_run/split_probe.py 16x8192 20x16384 24x8192 28x8192 32x8192 > $OUT/d256.txt 2>&1; echo "d256 rc=$?"; cat $OUT/d256.txt
HD=64 SPLITS=1,2,3,4 PAGE=16 timeout 100 python3 .device_run/split_probe.py 64x1024 64x2048 128x32768 > $OUT/d64.txt 2>&1; echo "d64 rc=$?"; cat $OUT/d64.txt
SPLITKV_DEVICE_DIR=B/.device timeout 150 bash tools/gpu/run_checks.sh smoke tests > $OUT/checks.log 2>&1; echo "checks rc=$?"; tail -2 $OUT/checks.log
timeout 200 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode (24|8) x .* d256$' --time_budget_s=180 --out_dir=$OUT/grid > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -2 $OUT/bench.log
