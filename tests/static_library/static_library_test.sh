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
