#!/usr/bin/env bash
# Session 54 call 2: the d64 and d256 decode grids beside FlashInfer (issue 18's decode cells).
source tools/gpu/call_lib.sh .device_run70/kits.tar.xz
source tools/gpu/install_peers.sh .device_run70/peers.tar.xz > "$OUT/peers.txt" 2>&1
export PYTHONPATH="$CALL_PKGS/k2:tests/python:.:${PYTHONPATH}"
log "bench d64/d256 decode grid"
timeout "$(left 570)" python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --only='^decode .* d(64|256)$' --time_budget_s=520 --out_dir="$OUT/grid" > "$OUT/grid.txt" 2>&1
log "rc=$?"
for t in graph eager; do python3 tools/bench/cells_behind.py "$OUT/grid/bench.json" --timing=$t > "$OUT/behind_$t.txt" 2>&1; done
log "done"
