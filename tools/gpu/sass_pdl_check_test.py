"""sass_pdl_check on synthetic cuobjdump output: a kernel passes only with ACQBULK before its
first global memory instruction; the merge_states op's kernels (launched without PDL) and
other architectures' code are not read."""

import sys

import pytest

from tools.gpu import sass_pdl_check
from tools.gpu.sass_loops import parse_functions


def _sass(functions, arch="sm_90a"):
    lines = [f"\tcode for {arch}"]
    for name, body in functions.items():
        lines.append(f"\t\tFunction : {name}")
        lines += [f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(body)]
    return lines


def _check(functions, arch="sm_90a"):
    return sass_pdl_check.check(parse_functions(_sass(functions, arch)))


def test_wait_before_global_access_passes():
    failed, checked = _check({"_ZN7splitkv4cuda15AttentionKernelE": [
        "S2R R0, SR_TID.X", "UTMACCTL.PF [UR8]", "SYNCS.EXCH.64 URZ, [UR6], UR4", "ACQBULK",
        "LDG.E R2, desc[UR4][R2.64]", "STG.E [R4.64], R2"]})
    assert (failed, checked) == ([], 1)


@pytest.mark.parametrize("early", ["@P0 LDG.E.CONSTANT R4, desc[UR22][R2.64]", "STG.E.128 [R4.64], R8",
                                   "RED.E.ADD.STRONG.GPU [R2.64], R3", "UTMALDG.3D [UR8], [UR4]",
                                   "LDGSTS.E.BYPASS.128 [R5], desc[UR6][R2.64]"])
def test_global_access_before_the_wait_fails(early):
    failed, checked = _check({"_ZN7splitkv4cuda16BulkDecodeKernelE": ["S2R R0, SR_TID.X", early, "ACQBULK"]})
    assert checked == 1 and len(failed) == 1 and failed[0][1] == f"{early} before ACQBULK"


def test_kernel_without_a_wait_fails_and_ungated_ones_are_skipped():
    failed, checked = _check({
        "_ZN7splitkv4cuda17PrefillSm90KernelE": ["S2R R0, SR_TID.X", "EXIT"],
        "_ZN7splitkv4cuda17MergeStatesKernelE": ["LDG.E R2, desc[UR4][R2.64]"],
        "_Z12other_kernelv": ["LDG.E R2, desc[UR4][R2.64]"]})
    assert checked == 1 and failed == [("_ZN7splitkv4cuda17PrefillSm90KernelE", "no ACQBULK")]


def test_other_architectures_code_is_not_read():
    failed, checked = _check({"_ZN7splitkv4cuda15AttentionKernelE": ["LDG.E R2, desc[UR4][R2.64]"]}, arch="sm_80")
    assert (failed, checked) == ([], 0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
