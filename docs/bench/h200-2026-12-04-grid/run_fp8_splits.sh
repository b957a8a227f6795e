#!/usr/bin/env bash
# fp8 decode at the issue-17 cells that miss: forced split counts beside the planned one (package v)
set -u
mkdir -p B && tar xJf .device_run/v.tar.xz -C B
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 200 python3 tools/gpu/decode_profile.py --time --fp8 24x4096 24x4096:HND:1 24x4096:HND:3 24x4096:HND:4 24x4096:HND:6 24x4096 \
  1x32768 1x32768:HND:16 1x32768:HND:24 1x32768:HND:48 1x32768:HND:64 1x32768 16x4096 16x4096:HND:1 16x4096:HND:4 16x4096 > $OUT/fp8.txt 2>&1; echo "fp8 rc=$?"
timeout 120 python3 tools/gpu/decode_profile.py --time 24x4096 1x32768 16x4096 24x4096 1x32768 16x4096 > $OUT/bf16.txt 2>&1; echo "bf16 rc=$?"
tail -16 $OUT/fp8.txt; tail -6 $OUT/bf16.txt
