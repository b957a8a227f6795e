#!/usr/bin/env bash
# Device call 2 (session 46): pdl90 = main 1259e89 + programmatic dependent launch (every
# attention kernel launched with programmatic stream serialization on sm_90, waiting for the
# previous grid before its first global access, releasing the next after its main loop).
# (1) every GPU test on pdl90 (incl. the new back-to-back chain test); (2) compute-sanitizer
# memcheck, racecheck, synccheck; (3) bench A/B main90 / pdl90 beside the peers: short_splits
# decode rows, then quick (--noflex).
# carry: [".device_run/k2.tar.xz", ".device_run/peers.tar.xz", ".device_run/c2.sh"]
source tools/gpu/call_lib.sh .device_run/k2.tar.xz
log "pytest -m gpu (pdl90)"
PYTHONPATH=/tmp/ab/pdl90:tests/python timeout 200 python3 -m pytest tests/python -m gpu -q -rs -p no:cacheprovider \
  > $OUT/pytest_pdl90.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest_pdl90.log | head -20 | tee -a $OUT/log.txt
tail -1 $OUT/pytest_pdl90.log | tee -a $OUT/log.txt
for tool in memcheck racecheck synccheck; do
  log "compute-sanitizer $tool"
  PYTHONPATH=/tmp/ab/pdl90:tests/python timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
    --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > $OUT/sanitizer_$tool.log 2>&1
  echo "$tool rc=$?" | tee -a $OUT/log.txt; grep -E "SUMMARY" $OUT/sanitizer_$tool.log | tee -a $OUT/log.txt
done
log "peers"; source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/peers.txt 2>&1
b() { # b PACKAGE PRESET ONLY TAG
  (( $(left 590) > 60 )) || { log "skip $1 $2: time"; return; }
  log "bench $1 $2"
  PYTHONPATH=/tmp/ab/$1:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout $(left 590) python3 tools/bench/bench.py \
    --device=cuda --shapes=$2 --noflex --max_gather_gb=0 --only="$3" --plot=false --out_dir=$OUT/$4 > $OUT/$4.log 2>&1
  echo "bench $4 rc=$?" | tee -a $OUT/log.txt
}
b main90 short_splits '^decode' short_main
b pdl90 short_splits '^decode' short_pdl
b pdl90 quick '^(decode|prefill)' quick_pdl
b main90 quick '^(decode|prefill)' quick_main
log done
