#!/usr/bin/env bash
# A = main's package, B = paged producer (four sleeping warps above 8 copies a tensor, else main's one; compiled apart)
set -u
mkdir -p A B && tar xJf .device_run/x.tar.xz -C A && tar xJf .device_run/y.tar.xz -C B
run_b() { PYTHONPATH=$PWD/B/.device:$PWD/tests/python:$PWD "$@"; }
run_a() { PYTHONPATH=$PWD/A/.device:$PWD/tests/python:$PWD "$@"; }
run_b timeout 240 python3 -m pytest tests/python/paged_prefill_sm90_test.py tests/python/prefill_sm90_test.py tests/python/batch_invariant_test.py tests/python/paged_attention_test.py -q -p no:cacheprovider --maxfail 10 > $OUT/tests_b.txt 2>&1; echo "tests rc=$?"; tail -1 $OUT/tests_b.txt; grep -E "^(FAILED|ERROR)" $OUT/tests_b.txt | head
for tool in racecheck memcheck synccheck; do
  run_b timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=PrefillSm90 python3 tools/gpu/sanitizer_cases.py "wgmma prefill" > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$?"; grep -E "SUMMARY|^BAD" $OUT/san_$tool.txt | head -5
done
for v in b a b a; do run_$v timeout 100 python3 tools/gpu/paged_prefill_probe.py > $OUT/probe_$v$RANDOM.txt 2>&1; done
for f in $OUT/probe_*.txt; do echo "== $f"; grep -v "H200" $f | sed 's/, max |paged - ragged| 0.0e+00//; s/ ms, /ms /'; done
