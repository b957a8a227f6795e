#!/usr/bin/env bash
# Device call 5 (session 46): final checks of main 364a0b7 (final90: PDL where sm_90a runs,
# review fixes). (1) every GPU test; (2) the SASS at the start of one decode and one prefill
# kernel (where griddepcontrol.wait lands); (3) overhead.py --issue_rows beside FlashInfer
# (issue 15's table); (4) the whole trace replay, default mode, float64 checks every 100th
# call; (5) d128 decode at batch 1 and 8 beside FlashInfer / FA3 in what is left.
# carry: [".device_run/k5.tar.xz", ".device_run/peers.tar.xz", ".device_run/c5.sh"]
source tools/gpu/call_lib.sh .device_run/k5.tar.xz
mkdir -p $OUT/r
log "pytest -m gpu (final90)"
PYTHONPATH=/tmp/ab/final90:tests/python timeout 150 python3 -m pytest tests/python -m gpu -q -rs -p no:cacheprovider \
  > $OUT/r/pytest_final90.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_final90.log | head -20 | tee -a $OUT/log.txt
tail -1 $OUT/r/pytest_final90.log | tee -a $OUT/log.txt
cuobjdump -sass /tmp/ab/final90/splitkv/_splitkv*.so > $OUT/r/sass.txt 2>&1
for k in BulkDecodeKernel PrefillSm90Kernel AttentionKernel; do
  awk -v k=$k '$0 ~ "Function : .*"k {c=1; n=0} c && n < 45 {print; n++} n == 45 {c=0}' $OUT/r/sass.txt | head -45 > $OUT/r/sass_head_$k.txt
done
grep -c "ACQBULK\|DEPBAR" $OUT/r/sass.txt > $OUT/r/sass_counts.txt; xz -9 $OUT/r/sass.txt
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/final90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "overhead --issue_rows"
timeout 120 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
echo "overhead rc=$?" | tee -a $OUT/log.txt
T=$(left 400); log "replay, default mode (timeout ${T}s)"
timeout $T python3 tools/replay/replay.py --device=cuda --max_requests=0 --check_every=100 --noprogress \
  > $OUT/r/replay.txt 2>&1
echo "rc=$?" >> $OUT/r/replay.txt; tail -8 $OUT/r/replay.txt | tee -a $OUT/log.txt
T=$(left 530); log "d128 decode batch 1 / 8 (timeout ${T}s)"
if (( T > 60 )); then
  timeout $T python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
    --only='^decode (1|8) x .* d128$' --time_budget_s=$(( T - 30 )) --out_dir=$OUT/r/grid > $OUT/r/grid.log 2>&1
  echo "bench rc=$?" | tee -a $OUT/log.txt
fi
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
