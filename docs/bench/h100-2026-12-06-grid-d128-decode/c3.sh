#!/usr/bin/env bash
# Device call 3 (session 45), main 8f1d7d7 (new90: head_dim 128 default decode grids on the
# wgmma-order tiles). (1) the new and the long-decode GPU tests of cuda_backend_test.py;
# (2) the head_dim-128 decode grid beside FlashInfer 0.7.2 / FA3 3.0.0, every row checked
# against float64; (3) the whole conversation trace (default mode) with float64 checks.
# carry: [".device_run/new.tar.xz", ".device_run/peers.tar.xz", ".device_run/c3.sh"]
source tools/gpu/call_lib.sh .device_run/new.tar.xz
log "pytest (new90)"
PYTHONPATH=/tmp/ab/new90:tests/python timeout 120 python3 -m pytest tests/python/cuda_backend_test.py -m gpu -q \
  -p no:cacheprovider -k "d128_decode_grid or long_decode or d64_decode_grid" > $OUT/pytest_new.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; tail -2 $OUT/pytest_new.log | tee -a $OUT/log.txt
log "peers"; source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/peers.txt 2>&1
( export PYTHONPATH=/tmp/ab/new90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
  log "d128 decode grid"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu_grid.txt
  timeout 330 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --only='^decode .* d128$' --time_budget_s=270 --out_dir=$OUT/grid > $OUT/bench.log 2>&1
  echo "bench rc=$?" | tee -a $OUT/log.txt; tail -3 $OUT/bench.log )
T=$(left 585); log "replay, default mode (timeout ${T}s)"
PYTHONPATH=/tmp/ab/new90:$PWD timeout $T python3 tools/replay/replay.py --device=cuda --max_requests=0 \
  --check_every=100 --noprogress > $OUT/replay.txt 2>&1
echo "rc=$?" >> $OUT/replay.txt; tail -14 $OUT/replay.txt | tee -a $OUT/log.txt
log done
