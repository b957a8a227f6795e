#!/usr/bin/env bash
# package u13 (d64 thin-last-wave splits past two waves): probe, GPU suite
set -u
mkdir -p B && tar xJf .device_run/u13.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/fi > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 150 python3 tools/gpu/decode_split_probe.py --head_dim=64 --splits=1,2,4 128x16384 160x32768 112x32768 144x16384 136x16384 > $OUT/d64.txt 2>&1; echo "rc=$?"; cat $OUT/d64.txt
OUT=/tmp/chk SPLITKV_DEVICE_DIR=B/.device timeout 170 bash tools/gpu/run_checks.sh smoke tests > $OUT/checks.log 2>&1; echo "checks rc=$?"; tail -2 $OUT/checks.log
