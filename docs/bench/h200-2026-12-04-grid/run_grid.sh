#!/usr/bin/env bash
# The d128 decode grid and every prefill row beside FlashInfer / FA3, main's kernels (z = ed30d8d; d6eb0b8's PTX is the same)
set -u
mkdir -p A && tar xJf .device_run/z.tar.xz -C A
source tools/gpu/install_peers.sh .device_run/peers > /dev/null
export PYTHONPATH=$PWD/A/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
timeout 560 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^(decode .* d128|prefill .*)$' --time_budget_s=480 --out_dir=$OUT/grid > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -5 $OUT/bench.log
