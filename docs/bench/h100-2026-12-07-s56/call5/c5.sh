#!/usr/bin/env bash
# Session 56 call 5: the whole trace on main c085000's replay over k3's package: with the
# batch-invariance check (issue 16), then over an fp8 cache (issue 17).
source tools/gpu/call_lib.sh .device_run73/kits.tar.xz
export PYTHONPATH="$CALL_PKGS/k3:tests/python:.:${PYTHONPATH}"
log "replay --batch_invariant whole trace"
timeout 270 python3 tools/replay/replay.py --device=cuda --batch_invariant --max_requests=0 --check_every=100 --noprogress > "$OUT/replay_inv.txt" 2>&1
log "rc=$? $(grep -E 'result|batch invariance|wall' $OUT/replay_inv.txt | tr '\n' ' ')"
log "replay --kv_dtype=fp8_e4m3 whole trace"
timeout "$(left 580)" python3 tools/replay/replay.py --device=cuda --kv_dtype=fp8_e4m3 --max_requests=0 --check_every=200 --noprogress > "$OUT/replay_fp8.txt" 2>&1
log "rc=$? $(grep -E 'result|max abs|wall' $OUT/replay_fp8.txt | tr '\n' ' ')"
log "done"
