#!/usr/bin/env bash
# Session 50 call 3: l62 (= main 8bc656f's kernels), m61 (c5ac024's) and r4 (session 44's ring-4 invariant
# d128 decode): host time per call beside FlashInfer (issue 15's rows) and the C++ launcher on
# this host; on an H200 the ring-4 A/B (issue 16) and the fp8 decode rows (issue 17).
source tools/gpu/call_lib.sh .device_run62/k4.tar.xz
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run62/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/l62:$PWD/tests/python:$PWD:${PYTHONPATH:-}
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" >> $OUT/log.txt 2>&1
timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
xz -dc .device_run62/launcher_bench.xz > /tmp/launcher_bench && chmod +x /tmp/launcher_bench
timeout 30 /tmp/launcher_bench 20000 cuda > $OUT/r/launcher_bench.txt 2>&1
log "launcher_bench rc=$?"; tail -6 $OUT/r/launcher_bench.txt | tee -a $OUT/log.txt
if on_h200; then
  inv m61 128 1; inv r4 128 1
  log "ring4 A/B done"; cp $OUT/inv128.txt $OUT/r/
fi
T=$(left 570)
if (( T > 60 )); then
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( T - 20 )) \
    --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
  log "bench rc=$?"
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
