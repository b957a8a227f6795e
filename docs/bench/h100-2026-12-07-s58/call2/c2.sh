#!/usr/bin/env bash
# Session 58 call 2 (the H100 of call 1, warm): issue 16's invariant decode cost at d64 / d128
# and issue 15's host time (no FlashInfer) on main e056074 (k9 + its Python).
source tools/gpu/call_lib.sh .device_run79/kits.tar.xz
chmod -R u+w $CALL_PKGS/k9 && cp python/splitkv/*.py $CALL_PKGS/k9/splitkv/ && cp python/splitkv/integrations/*.py $CALL_PKGS/k9/splitkv/integrations/
export PYTHONPATH=/tmp/ab/k9:$PWD/tests/python:$PWD
for d in 64 128; do
  timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d --rounds=1 > $OUT/inv$d.txt 2>&1
  log "inv d$d rc=$?"
done
timeout 80 python3 tools/bench/overhead.py --device=cuda --noflashinfer --iters=2000 --out_dir=$OUT/overhead > $OUT/overhead.log 2>&1
log "overhead rc=$?"
log done
