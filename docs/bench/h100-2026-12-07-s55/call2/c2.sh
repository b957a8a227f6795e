#!/usr/bin/env bash
# Session 55 call 2: the whole-trace replay with the batch-invariance check on main 59f4595's
# package (issue 16), then the d64 / d256 decode grids beside FlashInfer (issue 18).
source tools/gpu/call_lib.sh .device_run71/kits.tar.xz
source tools/gpu/install_peers.sh .device_run71/peers.tar.xz > "$OUT/peers.txt" 2>&1
export PYTHONPATH="$CALL_PKGS/k2:tests/python:.:${PYTHONPATH}"
log "replay --batch_invariant"
timeout 240 python3 tools/replay/replay.py --device=cuda --batch_invariant --max_requests=0 --check_every=100 > "$OUT/replay_inv.txt" 2>&1
log "rc=$? $(tail -3 $OUT/replay_inv.txt | tr '\n' ' ')"
log "bench d64/d256 decode grid"
timeout "$(left 560)" python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode .* d(64|256)$' --time_budget_s="$(left 520)" --out_dir="$OUT/grid" > "$OUT/grid.txt" 2>&1
log "rc=$?"
for t in graph eager; do python3 tools/bench/cells_behind.py "$OUT/grid/bench.json" --timing=$t > "$OUT/behind_$t.txt" 2>&1; done
log "done"
