#!/usr/bin/env bash
# Session 62 call 1: k18 = main fe73a4b's kernels + main 05e21ec's Python (the adapter's
# freed workspaces). Most important first (device time is short): every gpu-marked test
# (280 s limit), issue 15's host-time rows beside FlashInfer, the C++ launcher alone, then
# compute-sanitizer with what is left. CAP (env, default 520) is the call's budget in s.
CAP=${CAP:-520}
source tools/gpu/call_lib.sh .device_run90/kits.tar.xz
PYTHONPATH=$CALL_PKGS/k18:tests/python timeout $(left $(( CAP - 120 ))) python3 -m pytest tests/python -m gpu -q -rs \
  -p no:cacheprovider > $OUT/pytest_k18.log 2>&1
log "pytest -m gpu (k18) rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_k18.log | head -20 | tee -a $OUT/log.txt; tail -1 $OUT/pytest_k18.log | tee -a $OUT/log.txt
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run90/peers.tar.xz > $OUT/r/peers.txt 2>&1
PYTHONPATH=$CALL_PKGS/k18:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout $(left $(( CAP - 10 ))) python3 tools/bench/overhead.py \
  --device=cuda --issue_rows --iters=2000 --out_dir=$OUT/r/overhead > $OUT/r/overhead.log 2>&1
log "overhead k18 rc=$?"; cat $OUT/r/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
xz -dc .device_run90/launcher_bench.xz > /tmp/lb && chmod +x /tmp/lb && timeout 20 /tmp/lb 20000 cuda > $OUT/launcher_bench.txt 2>&1
log "launcher_bench rc=$?"; cat $OUT/launcher_bench.txt >> $OUT/log.txt
for tool in memcheck racecheck synccheck; do
  t=$(left $CAP); (( t > 20 )) || break
  PYTHONPATH=$CALL_PKGS/k18:tests/python timeout $(( t < 60 ? t : 60 )) compute-sanitizer --tool $tool --error-exitcode 9 \
    --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > $OUT/sanitizer_$tool.log 2>&1
  log "$tool (k18) rc=$? $(grep -E "SUMMARY" $OUT/sanitizer_$tool.log)"
done
log done
