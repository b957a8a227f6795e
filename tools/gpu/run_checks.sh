#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, after
# tools/gpu/build_package.sh staged the package in .device/ (carry it):
#
#   bash tools/gpu/run_checks.sh [smoke] [tests] [sanitize] [sass] [bench]   (default: all)
#
# smoke:    tools/gpu/sanitizer_cases.py without a sanitizer (a few seconds);
# tests:    every pytest test marked gpu in tests/python (correctness vs float64 and the CPU
#           backend, 1000+ interleaved launches on one workspace, CUDA graph replays);
# sanitize: compute-sanitizer memcheck, racecheck, synccheck on tools/gpu/sanitizer_cases.py;
# sass:     instruction counts per kernel from cuobjdump (spills, mma, cp.async), and
#           sass_pdl_check.py (each PDL-launched kernel waits before touching global memory);
# bench:    tools/bench/bench.py --shapes=quick (splitkv beside FlashInfer and FlashAttention-3
#           when their wheels are carried in .peers/ or $SPLITKV_PEERS_DIR (installed first by
#           tools/gpu/install_peers.sh), torch's SDPA, flex, varlen: decode TB/s, prefill
#           TFLOP/s, graph and eager, errors against float64); its files in $OUT/bench.
# Logs go to $OUT (the device tool's folder; /tmp/splitkv_checks elsewhere); a summary last.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
out="${OUT:-/tmp/splitkv_checks}"
mkdir -p "${out}"
device_dir="${SPLITKV_DEVICE_DIR:-.device}"  # where build_package.sh staged the package
export PYTHONPATH="${root}/${device_dir}:${root}/tests/python${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(smoke tests sanitize sass bench)
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "${out}/gpu.txt" 2>&1
python3 -c "import splitkv, torch; print('splitkv cuda backend:', splitkv.cuda_backend_available(), '| torch', torch.__version__, torch.cuda.get_device_name())" \
  | tee -a "${out}/gpu.txt"

for step in "${steps[@]}"; do
  case "${step}" in
    smoke)
      timeout 120 python3 tools/gpu/sanitizer_cases.py > "${out}/smoke.log" 2>&1
      rc=$?
      summary+=("smoke: rc=${rc}"); cat "${out}/smoke.log" | tail -n 8
      ;;
    tests)
      rm -f "${out}/metrics.jsonl"
      SPLITKV_METRICS="${out}/metrics.jsonl" timeout 330 python3 -m pytest tests/python -m gpu -q -rs \
        -p no:cacheprovider --timeout 120 --maxfail 40 > "${out}/pytest.log" 2>&1
      rc=$?
      summary+=("pytest -m gpu: rc=${rc} | $(tail -n 1 "${out}/pytest.log")")
      ;;
    sanitize)
      : > "${out}/sanitizer.log"
      for tool in memcheck racecheck synccheck; do
        echo "==== ${tool}" >> "${out}/sanitizer.log"
        # Only splitkv's kernels are instrumented (torch's run unchecked, and fast): kns= is
        # a substring of the kernel's name, and every splitkv kernel (AttentionKernel,
        # BulkDecodeKernel, PrefillSm90Kernel) lives in namespace splitkv::cuda, so its
        # mangled and demangled names both hold "splitkv" and no torch kernel's does. The
        # option's spelling changed across releases: try the other one if this is refused.
        for filter in --kernel-name --kernel-regex; do
          timeout 150 compute-sanitizer --tool "${tool}" --error-exitcode 9 "${filter}" kns=splitkv \
            python3 tools/gpu/sanitizer_cases.py > "${out}/sanitizer_part.log" 2>&1
          rc=$?
          grep -q "SUMMARY" "${out}/sanitizer_part.log" && break
        done
        cat "${out}/sanitizer_part.log" >> "${out}/sanitizer.log"
        rm -f "${out}/sanitizer_part.log"
        summary+=("compute-sanitizer ${tool}: rc=${rc} | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "${out}/sanitizer.log" | tail -n 1)")
      done
      ;;
    sass)
      # Per kernel: registers/spills are in the build log; here local-memory traffic and the
      # instructions that matter (mma, cp.async, ex2) in the shipped sm_90a code.
      # One disassembly (minutes on the GPU machine) read by both tools.
      cuobjdump -sass -arch sm_90a "${device_dir}"/splitkv/_splitkv*.so > "${out}/sass.txt" 2>&1
      python3 tools/gpu/sass_summary.py < "${out}/sass.txt" > "${out}/sass_summary.txt" 2>&1
      summary+=("sass: rc=$?"); cat "${out}/sass_summary.txt" | head -n 30
      # Every PDL-launched kernel waits for the previous grid before any global access.
      python3 tools/gpu/sass_pdl_check.py - < "${out}/sass.txt" > "${out}/sass_pdl_check.txt" 2>&1
      summary+=("sass_pdl_check: rc=$? | $(head -n 1 "${out}/sass_pdl_check.txt")")
      xz -9 -f "${out}/sass.txt"
      ;;
    bench)
      source tools/gpu/install_peers.sh "${SPLITKV_PEERS_DIR:-.peers}" > "${out}/bench.log" 2>&1
      # --time_budget_s starts no case past 150 s; the timeout leaves the last one time to end.
      timeout 240 python3 tools/bench/bench.py --device=cuda --shapes=quick --out_dir="${out}/bench" \
        --time_budget_s=150 --flex_compile_budget_s=45 >> "${out}/bench.log" 2>&1
      summary+=("bench: rc=$?")
      ;;
    *) echo "unknown step ${step}: expected smoke, tests, sanitize, sass or bench" >&2; exit 2 ;;
  esac
done

echo "==== failures (pytest)"; grep -E "^(FAILED|ERROR)" "${out}/pytest.log" 2>/dev/null | head -n 20
echo "==== bench"; cat "${out}/bench.log" 2>/dev/null | tail -n 30
echo "==== summary"; printf '%s\n' "${summary[@]}"
