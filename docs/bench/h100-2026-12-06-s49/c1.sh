#!/usr/bin/env bash
# Session 49 call 1: m61 (= main 0f3e48d) and rv61 (b6a07ad: tensor maps kept per thread).
# The GPU suite on rv61 (the transformers test's final form too); host time per call
# alternated m61 / rv61 / rv61 / m61 beside FlashInfer; the C++ launcher alone; the
# eager-vs-graph prefill probe (never run); on an H200 with time left, the fp8 decode rows.
source tools/gpu/call_lib.sh .device_run61/k2.tar.xz
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run61/peers.tar.xz > $OUT/r/peers.txt 2>&1
gpu_tests rv61
cp $OUT/pytest_rv61.log $OUT/r/
grep -E "tie allowance|noise" $OUT/pytest_rv61.log | head -5 | tee -a $OUT/log.txt
n=0
for pkg in m61 rv61 rv61 m61; do
  n=$((n + 1))
  PYTHONPATH=/tmp/ab/$pkg:$PWD/tests/python:$PWD timeout 80 python3 tools/bench/overhead.py --device=cuda \
    --out_dir=$OUT/r/overhead_${n}_$pkg > $OUT/r/overhead_${n}_$pkg.log 2>&1
  log "overhead $n $pkg rc=$?"
  grep -E "ragged|paged_attention\(out=\) |LaunchPaged|run\(\) " $OUT/r/overhead_${n}_$pkg.log | grep -v " vs " | head -9 >> $OUT/log.txt
done
xz -dc .device_run61/launcher_bench.xz > /tmp/launcher_bench && chmod +x /tmp/launcher_bench
timeout 30 /tmp/launcher_bench 20000 cuda > $OUT/r/launcher_bench.txt 2>&1
log "launcher_bench rc=$?"; tail -6 $OUT/r/launcher_bench.txt | tee -a $OUT/log.txt
export PYTHONPATH=/tmp/ab/rv61:$PWD/tests/python:$PWD:${PYTHONPATH:-}
T=$(left 560)
if (( T > 60 )); then
  log "eager_probe (timeout $((T > 100 ? 100 : T))s)"
  timeout $((T > 100 ? 100 : T)) python3 tools/gpu/eager_probe.py splitkv fa3 > $OUT/r/eager_probe.txt 2>&1
  log "eager_probe rc=$?"; tail -20 $OUT/r/eager_probe.txt >> $OUT/log.txt
fi
T=$(left 570)
if on_h200 && (( T > 60 )); then
  log "fp8 rows (timeout ${T}s)"
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^decode (24 x (4096|8192)|1 x 32768) d(64|256)$' --time_budget_s=$(( T - 20 )) \
    --out_dir=$OUT/r/fp8 > $OUT/r/fp8.log 2>&1
  log "bench rc=$?"
fi
log done
cp $OUT/log.txt $OUT/gpu.txt $OUT/r/ 2>/dev/null
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
