"""sass_summary's counts on synthetic cuobjdump output: a kind counts its modified forms and
only those (MUFU.EX2, not MUFU.RCP; LDL.64 is an LDL)."""

import sys

import pytest

from tools.gpu import sass_summary


def test_counts_modified_forms_of_each_kind_only():
    body = ["LDL.64 R2, [R1+0x8]", "@!P0 STL [R1], R4", "MUFU.EX2 R5, R6", "MUFU.RCP R7, R8",
            "HMMA.16816.F32.BF16 R8, R12, R16, R8", "BAR.SYNC.DEFER_BLOCKING 0x0", "RED.E.ADD.STRONG.GPU [R2], R3",
            "LDSM.16.M88.4 R20, [R21]"]
    counts = sass_summary.counts_of(list(enumerate(body)))
    assert {k: counts[k] for k in sass_summary.KINDS} == {
        "LDL": 1, "STL": 1, "HMMA": 1, "LDGSTS": 0, "LDSM": 1, "MUFU.EX2": 1, "BAR.SYNC": 1, "ATOMG": 0, "RED": 1}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
