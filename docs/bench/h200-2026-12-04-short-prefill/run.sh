#!/usr/bin/env bash
set -u
mkdir -p B && tar xJf .device_run/y.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/peers
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 200 python3 tools/gpu/prefill_profile.py --time trace trace:desc trace:asc 16x787 16x1024 64x256 4x4096 > $OUT/order.txt 2>&1; cat $OUT/order.txt
