#!/usr/bin/env bash
# Device call 1 (session 45): (1) on any card, d128 decode, decode_profile.py, alternated:
# page-64 boxes of 64 slots (main af012ea, cur90) against 16 (box16_90: backend_cuda.cu passes
# 16 to PagedKvMapsFor), default and batch-invariant mode; default-mode grids past one wave on
# the wgmma-order tiles (wo128_90) at pages 16 and 64; (2) overhead.py --issue_rows beside
# FlashInfer; (3) on an H200 only, the d128 invariant decode A/B of main against
# exp/decode-s-ahead-d128-ring4 (sa128_90) and the d64 invariant cost; on an H100, the head_dim
# 64 / 256 decode grid beside FlashInfer in what is left.
# carry: [".device_run/ab.tar.xz", ".device_run/peers.tar.xz", ".device_run/c1.sh"]
source tools/gpu/call_lib.sh .device_run/ab.tar.xz
SHAPES="64x4096 128x4096 64x8192 24x16384 8x8192 1x32768"
box() { echo "-- $1 p$2 ${3:-}" >> $OUT/box.txt
  PYTHONPATH=/tmp/ab/$1 timeout 50 python3 tools/gpu/decode_profile.py --time --page_size=$2 ${3:-} $SHAPES >> $OUT/box.txt 2>&1; }
log "box / wgmma-order A/B"
box cur90 64; box box16_90 64; box wo128_90 64; box cur90 16; box wo128_90 16
box wo128_90 16; box cur90 16; box wo128_90 64; box box16_90 64; box cur90 64
box box16_90 64 --invariant; box cur90 64 --invariant
grep -E "^-- |splits" $OUT/box.txt | tee -a $OUT/log.txt
log "peers"; source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/cur90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "overhead --issue_rows"
timeout 90 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/overhead > $OUT/overhead.log 2>&1
echo "overhead rc=$?" | tee -a $OUT/log.txt
if on_h200; then
  log "d128 A/B"; inv cur90 128 1; inv sa128_90 128 1; inv sa128_90 128 2; inv cur90 128 2
  grep -E "^-- |1 x 32768|8 x 4096" $OUT/inv128.txt | tee -a $OUT/log.txt
  log "d64 invariant cost"; inv cur90 64 1
else
  T=$(left 575); log "d64/d256 decode grid (timeout ${T}s)"
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --only='^decode .* d(64|256)$' --time_budget_s=$(( T - 60 )) --out_dir=$OUT/grid > $OUT/bench.log 2>&1
  echo "bench rc=$?" | tee -a $OUT/log.txt; tail -3 $OUT/bench.log
fi
log done
