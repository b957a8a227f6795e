#!/usr/bin/env bash
set -u
mkdir -p B && tar xJf .device_run/y.tar.xz -C B
run_b() { PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-} "$@"; }
source tools/gpu/install_peers.sh .device_run/peers
run_b timeout 200 python3 tools/bench/bench.py --device=cuda --shapes=quick --only='^prefill' --out_dir=$OUT/bench_b > $OUT/bench_b.txt 2>&1; echo "bench rc=$?"
grep -E "^\| prefill" $OUT/bench_b/bench.md | grep -E "splitkv paged \||paged \|| fa3 \||splitkv \||TFLOP" | cut -d'|' -f3,5,8,9,12,13,16 | head -40
