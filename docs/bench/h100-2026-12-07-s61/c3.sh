#!/usr/bin/env bash
# Session 61, the last of the device budget (~170 s): k17 = main d6dc55d. The GPU tests of
# the files this stop changed (call_cache, runners, transformers adapter, errors, out,
# concurrency), then the host time of k17 beside FlashInfer (issue 15's rows).
source tools/gpu/call_lib.sh .device_run89/kits.tar.xz
PYTHONPATH=$CALL_PKGS/k17:tests/python timeout 80 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
  tests/python/call_cache_test.py tests/python/runners_test.py tests/python/transformers_integration_test.py \
  tests/python/errors_test.py tests/python/out_argument_test.py tests/python/concurrency_test.py > $OUT/pytest_k17.log 2>&1
log "pytest -m gpu (changed files, k17) rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_k17.log | head -20 >> $OUT/log.txt; tail -1 $OUT/pytest_k17.log >> $OUT/log.txt
source tools/gpu/install_peers.sh .device_run89/peers.tar.xz > $OUT/peers.txt 2>&1
PYTHONPATH=$CALL_PKGS/k17:$PWD/tests/python:$PWD timeout $(left 165) python3 tools/bench/overhead.py --device=cuda \
  --iters=2000 --out_dir=$OUT/overhead > $OUT/overhead.log 2>&1
log "overhead k17 rc=$?"; cat $OUT/overhead/overhead.md >> $OUT/log.txt 2>/dev/null
log done
