#!/usr/bin/env bash
# Session 58 call 3 (H200 only; nothing on another card): issue 15's host-time table beside
# FlashInfer and issue 16's invariant decode cost at d64 / d128, on main e056074 (k9 + its Python).
source tools/gpu/call_lib.sh .device_run79/kits.tar.xz
if ! on_h200; then log "not an H200: nothing run"; exit 0; fi
chmod -R u+w $CALL_PKGS/k9 && cp python/splitkv/*.py $CALL_PKGS/k9/splitkv/ && cp python/splitkv/integrations/*.py $CALL_PKGS/k9/splitkv/integrations/
source tools/gpu/install_peers.sh .device_run79/peers.tar.xz > $OUT/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/k9:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 --out_dir=$OUT/overhead > $OUT/overhead.log 2>&1
log "overhead rc=$?"
for d in 64 128; do
  timeout 70 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d --rounds=1 > $OUT/inv$d.txt 2>&1
  log "inv d$d rc=$?"
done
log done
