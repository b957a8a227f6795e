#!/usr/bin/env bash
# package u8: tools/gpu/decode_split_probe.py tried (d256 batch 256, d64 batch 128)
set -u
mkdir -p B && tar xJf .device_run/u8.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 100 python3 tools/gpu/decode_split_probe.py --head_dim=256 --splits=1,2 256x8192 256x2048 > $OUT/d256.txt 2>&1; echo "rc=$?"; cat $OUT/d256.txt
timeout 100 python3 tools/gpu/decode_split_probe.py --head_dim=64 --splits=1,2,3,4 128x32768 96x32768 > $OUT/d64.txt 2>&1; echo "rc=$?"; cat $OUT/d64.txt
