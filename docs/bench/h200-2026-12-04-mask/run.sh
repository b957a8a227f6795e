#!/usr/bin/env bash
# A = HEAD's package (paged producers), C = + the mask's lower bound only where needed
set -u
mkdir -p A C && tar xJf .device_run/y.tar.xz -C A && tar xJf .device_run/z.tar.xz -C C
SPLITKV_DEVICE_DIR=C/.device timeout 300 bash tools/gpu/run_checks.sh smoke tests > $OUT/checks.txt 2>&1; tail -3 $OUT/checks.txt
for v in C A C A; do PYTHONPATH=$PWD/$v/.device:$PWD/tests/python:$PWD timeout 120 python3 tools/gpu/prefill_profile.py --time --nofa3 64x256 16x787 trace 4x4096 1x16384 > $OUT/t_$v$RANDOM.txt 2>&1; done
for f in $OUT/t_*.txt; do echo "== $f"; cat $f; done
