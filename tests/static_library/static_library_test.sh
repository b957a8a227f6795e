#!/usr/bin/env bash
# Installs //cc:splitkv_static's tarball into a fresh prefix and builds embed_main.cc
# against it with plain g++ and pkg-config (no Bazel cc rules), as a C++ runtime outside
# this repository would; then runs the program. C++17: the floor the headers promise.
#
#   static_library_test.sh <splitkv_static.tar.gz> <embed_main.cc>
set -euo pipefail

tarball="$1"
source="$2"
work="${TEST_TMPDIR:-$(mktemp -d)}"
prefix="${work}/prefix"

rm -rf "${prefix}" && mkdir -p "${prefix}"
tar -xzf "${tarball}" -C "${prefix}"
for f in include/cc/splitkv/launchers.h include/cc/splitkv/errors.h lib/libsplitkv.a \
         lib/pkgconfig/splitkv.pc; do
  [[ -f "${prefix}/${f}" ]] || { echo "missing ${f} in ${tarball}" >&2; exit 1; }
done

export PKG_CONFIG_PATH="${prefix}/lib/pkgconfig"
cflags="$(pkg-config --cflags splitkv)"
libs="$(pkg-config --libs splitkv)"
echo "pkg-config: ${cflags} ${libs}"

# shellcheck disable=SC2086  # the flags are word lists
"${CXX:-g++}" -std=c++17 -O1 -Wall -Wextra -Werror ${cflags} "${source}" -o "${work}/embed" ${libs}
"${work}/embed"

# The CPU kernels' three ISA builds (baseline, AVX2, AVX-512; one object name, three
# members) define no weak symbol outside their own namespaces: the linker keeps one copy of
# a weak symbol for all three, so a shared one (std::vector<float>::resize, say) could run
# AVX-512 code on the AVX2 path (isa.h). Only the C++ personality reference may be shared.
archive="${prefix}/lib/libsplitkv.a"
member="$(ar t "${archive}" | grep '^attention_kernels' | sort -u)"
[[ $(wc -l <<< "${member}") -eq 1 ]] || { echo "expected one kernel object name, got: ${member}" >&2; exit 1; }
builds="$(ar t "${archive}" | grep -c "^${member}$")"
[[ "${builds}" -eq 3 ]] || { echo "expected 3 builds of ${member}, got ${builds}" >&2; exit 1; }
mkdir -p "${work}/members"
for ((n = 1; n <= builds; n++)); do
  (cd "${work}/members" && rm -f "${member}" && ar xN "${n}" "${archive}" "${member}")
  shared="$(nm -C "${work}/members/${member}" | awk '$2 == "W" || $2 == "V"' \
            | grep -v -e 'splitkv::cpu::baseline::' -e 'splitkv::cpu::avx2::' -e 'splitkv::cpu::avx512::' \
                      -e 'DW.ref.__gxx_personality_v0' || true)"
  if [[ -n "${shared}" ]]; then
    echo "build ${n} of ${member} defines weak symbols outside its ISA namespace:" >&2
    echo "${shared}" >&2
    exit 1
  fi
done
echo "ok    the ${builds} ISA builds of ${member} share no weak symbol"
