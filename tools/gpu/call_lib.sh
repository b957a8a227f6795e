#!/usr/bin/env bash
# What every A/B device call script repeated, in one place. Source it on the GPU machine, from
# the checkout's root, at the top of a call script (tools/gpu/README.md, "A call script"):
#
#   source tools/gpu/call_lib.sh .device_run/ab.tar.xz   # unpacks the packages into /tmp/ab
#   log "d128 A/B"; inv main 128 1; inv branch 128 1; inv branch 128 2; inv main 128 2
#   gpu_tests branch; sanitize branch memcheck racecheck synccheck
#   if on_h200; then closing_figures branch .device_run/peers.tar.xz $OUT/r 555; fi
#   timeout "$(left 560)" python3 ...                     # what is left of a 560 s call
#
# The archive holds one folder a package (tools/gpu/build_package.sh's layout: splitkv/ and,
# in at least one of them, splitkv_reference/); packages without splitkv_reference get a copy
# of the first one found, since an archive keeps only one (it is the same in every build).
# Writes $OUT/gpu.txt (name, clocks) and $OUT/log.txt (each log line with seconds since the
# script began). Sourced without an archive (`source tools/gpu/call_lib.sh ""`) it unpacks
# nothing. It leaves the caller's shell options alone; a failed unpack ends the call script.
if [[ $# -ne 1 ]]; then
  echo "call_lib.sh: source it with one argument, the packages' .tar.xz (or \"\")" >&2
  exit 2
fi
CALL_T0=$(date +%s)
CALL_PKGS=/tmp/ab

# Seconds since the call script sourced this file.
elapsed() { echo $(( $(date +%s) - CALL_T0 )); }

# Seconds left of a budget of $1 seconds counted from the script's start (at least 1).
left() { local s=$(( $1 - $(elapsed) )); (( s > 0 )) && echo "$s" || echo 1; }

log() { echo "== t=$(elapsed) $*" | tee -a "$OUT/log.txt"; }

# True when the card is an H200 (the device may lend an H100 for a call that asked for one).
on_h200() { grep -q H200 "$OUT/gpu.txt"; }

# inv PACKAGE HEAD_DIM TAG: tools/bench/invariant_cost.py's decode rows for one package,
# appended to $OUT/inv<HEAD_DIM>.txt under a "-- PACKAGE rTAG" line (70 s at most).
inv() {
  echo "-- $1 r$3" >> "$OUT/inv$2.txt"
  PYTHONPATH="$CALL_PKGS/$1" timeout 70 python3 tools/bench/invariant_cost.py --device=cuda \
    --kinds=decode --head_dim="$2" --rounds=2 >> "$OUT/inv$2.txt" 2>&1
}

# dprof PACKAGE PAGE_SIZE SHAPES...: tools/gpu/decode_profile.py --time rows (d128 bf16
# decode) for one package at one page size, appended to $OUT/dprof.txt under a "-- PACKAGE
# pPAGE_SIZE" line (50 s at most). The script prints its rows as it goes and again at the
# end; only the end's are kept.
dprof() {
  local pkg=$1 page=$2
  shift 2
  echo "-- $pkg p$page" >> "$OUT/dprof.txt"
  PYTHONPATH="$CALL_PKGS/$pkg" timeout 50 python3 tools/gpu/decode_profile.py --time --page_size="$page" "$@" \
    > "$OUT/dprof_part.txt" 2>&1
  tail -n "$#" "$OUT/dprof_part.txt" >> "$OUT/dprof.txt"
}

# gpu_tests PACKAGE: every pytest test marked gpu on one package, into $OUT/pytest_PACKAGE.log
# (150 s at most); the rc, failures and summary line go to the log.
gpu_tests() {
  PYTHONPATH="$CALL_PKGS/$1:tests/python" timeout 150 python3 -m pytest tests/python -m gpu -q -rs \
    -p no:cacheprovider > "$OUT/pytest_$1.log" 2>&1
  log "pytest -m gpu ($1) rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$1.log" | head -20 | tee -a "$OUT/log.txt"
  tail -1 "$OUT/pytest_$1.log" | tee -a "$OUT/log.txt"
}

# sanitize PACKAGE TOOL...: compute-sanitizer (memcheck, racecheck, synccheck) over
# tools/gpu/sanitizer_cases.py, splitkv's kernels only, into $OUT/sanitizer_TOOL.log (60 s each).
sanitize() {
  local pkg=$1 tool
  shift
  for tool in "$@"; do
    PYTHONPATH="$CALL_PKGS/$pkg:tests/python" timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      --kernel-name kns=splitkv python3 tools/gpu/sanitizer_cases.py > "$OUT/sanitizer_$tool.log" 2>&1
    log "$tool ($pkg) rc=$? $(grep -E "SUMMARY" "$OUT/sanitizer_$tool.log")"
  done
}

# closing_figures PACKAGE PEERS_ARCHIVE DIR BUDGET: the H200 figures every stop's closing note
# re-measures, for one package beside the peers (tools/gpu/install_peers.sh's archive), under
# DIR: issue 15's host time (overhead.py --issue_rows, beside FlashInfer), issue 16's
# invariant decode cost at d64 / d128 (inv64.txt, inv128.txt), issue 17's fp8 decode rows
# beside bf16 (fp8/) and issue 18's d128 prefill rows beside FlashInfer and FA3 (prepeers/);
# the last step gets what is left of BUDGET seconds from the script's start.
closing_figures() {
  local pkg=$1 peers=$2 dir=$3 budget=$4 d t
  mkdir -p "$dir"
  source tools/gpu/install_peers.sh "$peers" > "$dir/peers.txt" 2>&1
  export PYTHONPATH="$CALL_PKGS/$pkg:$PWD/tests/python:$PWD:${PYTHONPATH:-}"
  timeout 100 python3 tools/bench/overhead.py --device=cuda --issue_rows --iters=2000 \
    --out_dir="$dir/overhead" > "$dir/overhead.log" 2>&1
  log "overhead rc=$?"; cat "$dir/overhead/overhead.md" >> "$OUT/log.txt" 2>/dev/null
  for d in 64 128; do
    timeout 75 python3 tools/bench/invariant_cost.py --device=cuda --kinds=decode --head_dim=$d \
      --rounds=2 > "$dir/inv$d.txt" 2>&1
    log "inv d$d rc=$?"
  done
  t=$(left $(( budget - 155 )))
  timeout "$t" python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --plot=false --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=$(( t - 20 )) \
    --out_dir="$dir/fp8" > "$dir/fp8.log" 2>&1
  log "fp8 decode bench rc=$?"
  t=$(left "$budget")
  timeout "$t" python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
    --plot=false --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d128$' --time_budget_s=$(( t - 15 )) \
    --out_dir="$dir/prepeers" > "$dir/prepeers.log" 2>&1
  log "prefill+peers bench rc=$?"
}

if [[ -n "$1" ]]; then
  rm -rf "$CALL_PKGS" && mkdir -p "$CALL_PKGS" && tar xJf "$1" -C "$CALL_PKGS" ||
    { echo "call_lib.sh: could not unpack $1 into $CALL_PKGS" >&2; exit 1; }
  ref="$(ls -d "$CALL_PKGS"/*/splitkv_reference 2>/dev/null | head -1)"
  for pkg in "$CALL_PKGS"/*/; do
    [[ -d "$pkg/splitkv_reference" || -z "$ref" ]] || cp -r "$ref" "$pkg"
  done
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
