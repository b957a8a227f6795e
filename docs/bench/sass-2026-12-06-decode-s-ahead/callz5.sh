#!/usr/bin/env bash
# Device call Z5: exp/decode-s-ahead-d128-ring4 (sa128_90: the 4-part ring for batch-invariant d128
# grids of at most one CTA an SM) against main 65e5c2f (cur90). Tests of the branch, the d128 and
# d64 invariant decode alternated, then (if the tests pass) the whole-trace replay with
# --batch_invariant on the branch.
# carry: [".device_run/abz5.tar.xz", ".device_run/callz5.sh"]
set -u
rm -rf /tmp/ab; mkdir -p /tmp/ab && tar xJf .device_run/abz5.tar.xz -C /tmp/ab
cp -r /tmp/ab/cur90/splitkv_reference /tmp/ab/sa128_90/ 2>/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s); log() { echo "== t=$(( $(date +%s) - T0 )) $*" | tee -a $OUT/log.txt; }
inv() { echo "-- $1 r$3" >> $OUT/inv$2.txt
  PYTHONPATH=/tmp/ab/$1 timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$2 --rounds=2 >> $OUT/inv$2.txt 2>&1; }
log "tests sa128_90"
PYTHONPATH=/tmp/ab/sa128_90:tests/python timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/python/batch_invariant_test.py tests/python/paged_attention_test.py tests/python/sinks_test.py \
  > $OUT/tests_sa128_90.log 2>&1; rc=$?; echo "rc=$rc" >> $OUT/tests_sa128_90.log; tail -2 $OUT/tests_sa128_90.log | tee -a $OUT/log.txt
log "d128"; inv cur90 128 1; inv sa128_90 128 1; inv sa128_90 128 2; inv cur90 128 2
log "d64"; inv sa128_90 64 1; inv cur90 64 1
if [[ $rc == 0 ]]; then
  log "replay --batch_invariant sa128_90"
  PYTHONPATH=/tmp/ab/sa128_90 timeout 230 python3 tools/replay/replay.py --device=cuda --max_requests=0 \
    --batch_invariant --check_every=100 --noprogress > $OUT/replay_batch_invariant.txt 2>&1; echo "rc=$?" >> $OUT/replay_batch_invariant.txt
  tail -12 $OUT/replay_batch_invariant.txt | tee -a $OUT/log.txt
fi
log done
