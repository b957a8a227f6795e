#!/usr/bin/env bash
# Builds splitkv for the GPU machine and stages it in .device/splitkv (git-ignored): the
# Python sources plus the extension compiled with --config=cuda (sm_90a + sm_80 kernels,
# static CUDA runtime) against Python 3.12, the GPU machine's interpreter. Beside it,
# .device/splitkv_reference: the float64 reference the tests, the replay and the bench
# import. That machine has no Bazel, so the build happens here and .device travels with
# the device tool's `carry`.
#
#   tools/gpu/build_package.sh            # then: run(command="bash tools/gpu/run_checks.sh",
#                                         #            carry=[".device"])
# Environment: SPLITKV_GPU_PYTHON (default pyenv's 3.12.1), BAZEL_OUTPUT_BASE (optional
# --output_base, so parallel builds don't share one Bazel server).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
python="${SPLITKV_GPU_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3.12}"
startup=()
[[ -n "${BAZEL_OUTPUT_BASE:-}" ]] && startup=(--output_base="${BAZEL_OUTPUT_BASE}")
flags=(--config=cuda --repo_env=SPLITKV_PYTHON="${python}")

./tools/bazel "${startup[@]}" build "${flags[@]}" //python/splitkv
bin="$(./tools/bazel "${startup[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)"
suffix="$("${python}" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"

rm -rf .device/splitkv .device/splitkv_reference
mkdir -p .device/splitkv .device/splitkv_reference
cp python/splitkv/*.py .device/splitkv/
cp "${bin}/python/splitkv/_splitkv${suffix}" .device/splitkv/
cp python/splitkv_reference/*.py .device/splitkv_reference/
chmod u+w .device/splitkv/* .device/splitkv_reference/*
echo "staged $(du -sh .device/splitkv | cut -f1) in .device/splitkv ($(ls .device/splitkv | tr '\n' ' '))"
echo "staged .device/splitkv_reference ($(ls .device/splitkv_reference | tr '\n' ' '))"
