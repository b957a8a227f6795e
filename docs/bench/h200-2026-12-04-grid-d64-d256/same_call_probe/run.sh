#!/usr/bin/env bash
# d64 decode: the bench's rows (FlashInfer beside) and the probe's, one call, package v
set -u
mkdir -p B && tar xJf .device_run/v.tar.xz -C B
source tools/gpu/install_peers.sh .device_run/peers > /dev/null
export PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 150 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode (256 x 8192|64 x 32768) d64$' --out_dir=$OUT/b > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -E "splitkv  |splitkv invariant|fa2 tc|cudnn" $OUT/bench.log | grep -v "^|" | cut -c1-150
timeout 100 python3 tools/gpu/decode_stream_probe.py --head_dim=64 --noin_order --splits=1,2,4,1 --shapes=256x8192,64x32768 > $OUT/probe.txt 2>&1; echo "probe rc=$?"
grep -v "^|---" $OUT/probe.txt
