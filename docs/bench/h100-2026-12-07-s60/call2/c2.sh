#!/usr/bin/env bash
# Session 60 call 2: issue 15's C++ layout keys (k13 = main efdca6f: LayoutKey reads the
# tensors' layouts and addresses through torch's DLPack table; the launch asks it for the
# current stream) against main 42d661a (k11 with 42d661a's Python). The reader's state, the
# per-call path's tests, host time per call beside FlashInfer (overhead.py --issue_rows,
# k11 then k13), every test marked gpu on k13.
source tools/gpu/call_lib.sh .device_run86/kits.tar.xz
python3 -c "import torch; print('torch', torch.__version__)" | tee -a $OUT/log.txt
PYTHONPATH=$CALL_PKGS/k13 python3 -c "from splitkv import _splitkv, _calls; print('reader', _splitkv.InitTensorReader(), _calls._read_layouts)" 2>&1 | tee -a $OUT/log.txt
PYTHONPATH=$CALL_PKGS/k13:tests/python timeout 120 python3 -m pytest tests/python/call_cache_test.py tests/python/concurrency_test.py tests/python/runners_test.py -q -rs \
  -p no:cacheprovider > $OUT/key_tests.log 2>&1
log "call_cache/concurrency/runners tests (k13, cpu+gpu) rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/key_tests.log | head -20 >> $OUT/log.txt; tail -1 $OUT/key_tests.log | tee -a $OUT/log.txt
source tools/gpu/install_peers.sh .device_run86/peers.tar.xz > $OUT/peers.txt 2>&1
log "peers rc=$?"
for pkg in k11 k13; do
  PYTHONPATH=$CALL_PKGS/$pkg:$PWD/tests/python:$PWD:${PYTHONPATH:-} timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows \
    --iters=2000 --out_dir=$OUT/overhead_$pkg > $OUT/overhead_$pkg.log 2>&1
  log "overhead $pkg rc=$?"; echo "-- $pkg" >> $OUT/log.txt; cat $OUT/overhead_$pkg/overhead.md >> $OUT/log.txt 2>/dev/null
done
gpu_tests k13
log done
