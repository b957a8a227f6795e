#!/usr/bin/env bash
# package u8: many-wave grids at d256 and d64, forced split counts beside FlashInfer
set -u
mkdir -p B && tar xJf .device_run/u8.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 200 python3 tools/gpu/decode_split_probe.py --head_dim=256 --splits=1,2,3 128x16384 160x16384 192x8192 256x4096 256x16384 320x8192 > $OUT/d256.txt 2>&1; echo "rc=$?"; cat $OUT/d256.txt
timeout 150 python3 tools/gpu/decode_split_probe.py --head_dim=64 --splits=1,2,3,4 128x16384 160x32768 192x16384 256x32768 > $OUT/d64.txt 2>&1; echo "rc=$?"; cat $OUT/d64.txt
