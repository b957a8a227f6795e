#!/usr/bin/env bash
# Session 56 call 4: the replay's new flag checks and slot sizing on CUDA (main c085000's
# tools/replay over k3's package): a default run and a batch-invariant run on part of the trace.
source tools/gpu/call_lib.sh .device_run73/kits.tar.xz
export PYTHONPATH="$CALL_PKGS/k3:tests/python:.:${PYTHONPATH}"
log "replay cuda 400 requests"
timeout 200 python3 tools/replay/replay.py --device=cuda --max_requests=400 --check_every=50 --noprogress > "$OUT/replay.txt" 2>&1
log "rc=$? $(grep -E 'result|request checks' $OUT/replay.txt | tr '\n' ' ')"
log "replay cuda --batch_invariant 400 requests"
timeout 250 python3 tools/replay/replay.py --device=cuda --batch_invariant --max_requests=400 --check_every=50 --noprogress > "$OUT/replay_inv.txt" 2>&1
log "rc=$? $(grep -E 'result|batch invariance' $OUT/replay_inv.txt | tr '\n' ' ')"
log "done"
