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
# --output_base, so parallel builds don't share one Bazel server), SPLITKV_DEVICE_DIR (staging
# folder, default .device; any .device* name is git-ignored, so parallel work can carry its own).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
python="${SPLITKV_GPU_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3.12}"
startup=()
[[ -n "${BAZEL_OUTPUT_BASE:-}" ]] && startup=(--output_base="${BAZEL_OUTPUT_BASE}")
flags=(--config=cuda --repo_env=SPLITKV_PYTHON="${python}")
dest="${SPLITKV_DEVICE_DIR:-.device}"

./tools/bazel "${startup[@]}" build "${flags[@]}" //python/splitkv
bin="$(./tools/bazel "${startup[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)"
suffix="$("${python}" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"

rm -rf "${dest}/splitkv" "${dest}/splitkv_reference"
mkdir -p "${dest}/splitkv/integrations" "${dest}/splitkv_reference"
cp python/splitkv/*.py "${dest}/splitkv/"
cp python/splitkv/integrations/*.py "${dest}/splitkv/integrations/"
cp "${bin}/python/splitkv/_splitkv${suffix}" "${dest}/splitkv/"
cp python/splitkv_reference/*.py "${dest}/splitkv_reference/"
chmod -R u+w "${dest}"/splitkv "${dest}"/splitkv_reference
echo "staged $(du -sh "${dest}/splitkv" | cut -f1) in ${dest}/splitkv ($(ls "${dest}/splitkv" | tr '\n' ' '))"
echo "staged ${dest}/splitkv_reference ($(ls "${dest}/splitkv_reference" | tr '\n' ' '))"
