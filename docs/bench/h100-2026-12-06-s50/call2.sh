#!/usr/bin/env bash
# Session 50 call 2 (one command line, on the warm H100 after call 1): the GPU suite on l62,
# then decode_profile --time --fp8 at head_dim 64 and 128 alternated l62 / m61 / m61 / l62.
source tools/gpu/call_lib.sh .device_run62/k4.tar.xz; mkdir -p $OUT/r; gpu_tests l62; cp $OUT/pytest_l62.log $OUT/r/
for pkg in l62 m61 m61 l62; do for hd in 64 128; do echo "-- $pkg d$hd" >> $OUT/r/ab2.txt
  PYTHONPATH=/tmp/ab/$pkg:$PWD timeout 40 python3 tools/gpu/decode_profile.py --time --fp8 --head_dim=$hd \
    24x4096 24x8192 64x4096 1x32768 > $OUT/r/p.txt 2>&1; tail -4 $OUT/r/p.txt >> $OUT/r/ab2.txt; done; done
cat $OUT/r/ab2.txt; cp $OUT/log.txt $OUT/r/; tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
