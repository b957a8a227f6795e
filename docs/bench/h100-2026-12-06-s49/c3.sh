#!/usr/bin/env bash
# Session 49 call 3, on m61 (= main 0f3e48d's kernels; main now differs only in docs):
# host time per call and the issue's decode rows beside FlashInfer (call 1 dropped the peers'
# PYTHONPATH); on an H200 also session 44's ring-4 A/B (r4) and the fp8 decode rows.
source tools/gpu/call_lib.sh .device_run61/k3.tar.xz
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run61/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/m61:$PWD/tests/python:$PWD:${PYTHONPATH:-}
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" >> $OUT/log.txt 2>&1
timeout 150 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
timeout 80 python3 tools/gpu/decode_profile.py --time --head_dim=64 --fp8 1x32768 1x32768:HND:16 1x32768:HND:24 \
  1x32768:HND:40 > $OUT/r/probe_fp8_d64.txt 2>&1
timeout 40 python3 tools/gpu/decode_profile.py --time --head_dim=64 1x32768 >> $OUT/r/probe_fp8_d64.txt 2>&1
log "probe rc=$?"; tail -6 $OUT/r/probe_fp8_d64.txt >> $OUT/log.txt
if on_h200; then
  inv m61 128 1; inv r4 128 1; inv r4 128 2; inv m61 128 2
  log "ring4 A/B done"; cp $OUT/inv128.txt $OUT/r/
  T=$(left 570)
  if (( T > 60 )); then
    timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
      --only='^decode (24 x (4096|8192)|1 x 32768) d(64|256)$' --time_budget_s=$(( T - 20 )) \
      --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
    log "bench rc=$?"
  fi
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
