#!/usr/bin/env bash
# Issue 5 on the GPU machine (device tool), from the repository root, after
# tools/gpu/build_package.sh staged the package in .device/ (carry it; SPLITKV_DEVICE_DIR names another staging folder):
#
#   bash tests/stress/run_gpu.sh [scale] [tests] [stress]     (default: all three)
#
# scale:  tests/stress/scale_gpu.py: one call over > 2**31 elements of KV cache with a batch
#         of 70,000 requests (paged decode, HND and NHD, planned and forced splits) and a
#         ragged prefill of 70,000 requests over k, v of > 2**31 elements each (~1-2 min);
# tests:  the gpu-marked tests of concurrency_test.py (two streams, two workspaces) and
#         bad_inputs_test.py (refusals and documented results on CUDA) (~1 min);
# stress: tests/stress/stress.py --device=cuda --launches=100000 (SPLITKV_STRESS_LAUNCHES
#         overrides the count) (~3-5 min: a pool of 800 problems, then the launches).
# Each command of the device tool may run 10 minutes: run `stress` on its own call.
# Logs go to $OUT (/tmp/splitkv_stress elsewhere); a summary comes last.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
out="${OUT:-/tmp/splitkv_stress}"
mkdir -p "${out}"
export PYTHONPATH="${root}/${SPLITKV_DEVICE_DIR:-.device}:${root}/tests/python${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(scale tests stress)
summary=()

python3 -c "import splitkv, torch; print('splitkv cuda backend:',
  splitkv.cuda_backend_available(), '| torch', torch.__version__, torch.cuda.get_device_name())" \
  | tee "${out}/gpu.txt"

for step in "${steps[@]}"; do
  start=${SECONDS}
  case "${step}" in
    scale)
      timeout 420 python3 tests/stress/scale_gpu.py > "${out}/scale.log" 2>&1
      rc=$?
      sed -n '/splitkv scale summary/,$p' "${out}/scale.log"
      ;;
    tests)
      timeout 420 python3 -m pytest tests/python/concurrency_test.py \
        tests/python/bad_inputs_test.py -m gpu -q -rs -p no:cacheprovider > "${out}/tests.log" 2>&1
      rc=$?
      tail -n 15 "${out}/tests.log"
      ;;
    stress)
      timeout 570 python3 tests/stress/stress.py --device=cuda \
        --launches="${SPLITKV_STRESS_LAUNCHES:-100000}" --seed=1 > "${out}/stress.log" 2>&1
      rc=$?
      grep -A 40 "^FAILED launch\|splitkv stress summary" "${out}/stress.log" | head -n 60
      ;;
    *)
      echo "unknown step ${step}: expected scale, tests or stress"
      rc=2
      ;;
  esac
  last="$(tail -n 1 "${out}/${step}.log" 2>/dev/null)"
  summary+=("${step}: rc=${rc} in $((SECONDS - start)) s | ${last}")
done

echo "==== summary"
printf '%s\n' "${summary[@]}" | tee "${out}/summary.txt"
