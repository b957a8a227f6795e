#!/usr/bin/env bash
# Next session: d64 decode on the wgmma-order tiles (package u = main + wgmma_order_d64.patch)
set -u
mkdir -p U && tar xJf .device_run/u.tar.xz -C U
export PYTHONPATH=$PWD/U/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 200 python3 .device_run/d64_probe.py > $OUT/probe.txt 2>&1; echo "probe rc=$?"; cat $OUT/probe.txt
SPLITKV_D64_WGMMA_ORDER=1 timeout 200 python3 -m pytest tests/python/paged_attention_test.py tests/python/sinks_test.py -m gpu -q -p no:cacheprovider -k "64" > $OUT/tests.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/tests.txt
