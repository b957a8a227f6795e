#!/usr/bin/env bash
# Session 56 call 1: every GPU test on main 0a897cf's package (the ops' compile fixes, the
# transformers integration's checks, CheckOptions had not run on a GPU), memcheck, issue 15's
# host table with the ragged diagnostics (C++ launcher alone, the sm_90 path off), and a CUPTI
# profile of the tiny ragged and paged calls' runtime API time.
source tools/gpu/call_lib.sh .device_run72/kits.tar.xz
source tools/gpu/install_peers.sh .device_run72/peers.tar.xz > "$OUT/peers.txt" 2>&1
BASEPP="tests/python:.:${PYTHONPATH}"
log "overhead k2"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 130 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 --out_dir="$OUT/overhead_k2" > "$OUT/overhead_k2.txt" 2>&1
log "rc=$?"
log "api profile"
PYTHONPATH="$CALL_PKGS/k2:$BASEPP" timeout 60 python3 .device_run72/api_prof.py > "$OUT/api_prof.txt" 2>&1
log "rc=$?"
gpu_tests k2
sanitize k2 memcheck
log "done"
