#!/usr/bin/env bash
# The wave-split planner (v): planned against forced 1 split, the batch-256 bench rows beside the peers, the GPU suite
set -u
mkdir -p B && tar xJf .device_run/v.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/peers > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 200 python3 tools/gpu/decode_stream_probe.py --nopeers --noin_order --splits=1,1 \
  --shapes=256x32768,192x16384,160x16384,128x32768,320x8192,384x8192,256x4096 > $OUT/probe.txt 2>&1; echo "probe rc=$?"
grep -v "^|---" $OUT/probe.txt
timeout 300 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode 256 x (4096|8192|16384|32768) d128$' --out_dir=$OUT/b256 > $OUT/bench.log 2>&1; echo "bench rc=$?"
awk '/splitkv against/{f=1} f' $OUT/b256/bench.md | awk -F'|' 'NR>3 {print $3"|"$5"|"$7"|"$10"|"$11"|"$12"|"$15"|"$16}'
SPLITKV_DEVICE_DIR=B/.device timeout 200 bash tools/gpu/run_checks.sh smoke tests > $OUT/checks.txt 2>&1; echo "checks rc=$?"; tail -4 $OUT/checks.txt
