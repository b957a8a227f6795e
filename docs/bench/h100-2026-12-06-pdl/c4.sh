#!/usr/bin/env bash
# Device call 4 (session 46): pdlx90 = main 2abf395's kernels (PDL, no early release).
# (1) every GPU test; (2) compute-sanitizer memcheck, racecheck, synccheck; (3) prefill A/B
# against main90 (1259e89), prefill_profile.py --time --nofa3, alternating processes, d128
# and d64; (4) host time per call, overhead.py (tiny calls, main90 / pdlx90). Results in $OUT/r.tar.xz.
# carry: [".device_run/k4.tar.xz", ".device_run/c4.sh"]
source tools/gpu/call_lib.sh .device_run/k4.tar.xz
mkdir -p $OUT/r
log "pytest -m gpu (pdlx90)"
PYTHONPATH=/tmp/ab/pdlx90:tests/python timeout 200 python3 -m pytest tests/python -m gpu -q -rs -p no:cacheprovider \
  > $OUT/r/pytest_pdlx90.log 2>&1
echo "pytest rc=$?" | tee -a $OUT/log.txt; grep -E "^(FAILED|ERROR)" $OUT/r/pytest_pdlx90.log | head -20 | tee -a $OUT/log.txt
tail -1 $OUT/r/pytest_pdlx90.log | tee -a $OUT/log.txt
for tool in memcheck racecheck synccheck; do
  log "compute-sanitizer $tool"
  PYTHONPATH=/tmp/ab/pdlx90:tests/python timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
    --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > $OUT/r/sanitizer_$tool.log 2>&1
  echo "$tool rc=$?" | tee -a $OUT/log.txt; grep -E "SUMMARY" $OUT/r/sanitizer_$tool.log | tee -a $OUT/log.txt
done
pf() { # pf PACKAGE HEAD_DIM
  (( $(left 560) > 40 )) || { log "skip pf $1 $2"; return; }
  echo "-- $1 d$2" >> $OUT/r/prefill.txt
  PYTHONPATH=/tmp/ab/$1 timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$2 \
    1x16384 4x4096 8x2048 trace >> $OUT/r/prefill.txt 2>&1
}
log "prefill A/B"
pf main90 128; pf pdlx90 128; pf pdlx90 128; pf main90 128; pf main90 64; pf pdlx90 64
grep -vE "^\s*$" $OUT/r/prefill.txt | tail -40 | tee -a $OUT/log.txt
for pkg in main90 pdlx90 main90 pdlx90; do
  (( $(left 570) > 50 )) || break
  log "overhead $pkg"
  PYTHONPATH=/tmp/ab/$pkg:$PWD/tests/python:$PWD timeout 60 python3 tools/bench/overhead.py --device=cuda --noflashinfer \
    --out_dir=$OUT/r/overhead_$pkg > $OUT/r/overhead_$pkg.log 2>&1
  tail -12 $OUT/r/overhead_$pkg.log >> $OUT/r/overhead_all.txt
done
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
