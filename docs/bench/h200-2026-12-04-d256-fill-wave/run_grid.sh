#!/usr/bin/env bash
# package u8 (the d256 fill-wave rule over [1/8, 1] wave from 4096 keys): probe, GPU checks, the d256 decode grid
set -u
mkdir -p B && tar xJf .device_run/u8.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
HD=256 SPLITS=2,4,8 PAGE=16 timeout 130 python3 .device_run/split_probe.py 8x4096 8x8192 12x16384 16x4096 24x4096 4x16384 > $OUT/d256.txt 2>&1; echo "d256 rc=$?"; cat $OUT/d256.txt
OUT=/tmp/chk SPLITKV_DEVICE_DIR=B/.device timeout 150 bash tools/gpu/run_checks.sh smoke tests > $OUT/checks.log 2>&1; echo "checks rc=$?"; tail -2 $OUT/checks.log
timeout 280 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode .* d256$' --time_budget_s=260 --out_dir=$OUT/g > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -2 $OUT/bench.log; rm -f $OUT/g/bench.png
