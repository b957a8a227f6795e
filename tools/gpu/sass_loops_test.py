"""sass_loops on synthetic cuobjdump output: the loop holding both wgmma waits, its HGMMAs, and
the softmax's instructions between the waits and after the second."""

import io

import pytest

from tools.gpu import sass_loops


def _sass(name, body):
    lines = [f"\t\tFunction : {name}"]
    lines += [f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(body)]
    return lines


_LOOP = [
    "MOV R1, R2",  # 0x00: before the loop
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10], R17",  # 0x10: loop head
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], RZ, !UPT, gsb0",
    "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0",
    "WARPGROUP.DEPBAR.LE gsb0, 0x1",
    "FMNMX R3, R4, R5, !PT",
    "MUFU.EX2 R6, R7",
    "@!P1 BRA 0x90",  # a forward branch: not a loop
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
    "MUFU.EX2 R8, R9",  # 0x90
    "FMUL R10, R10, R11",
    "FADD.FTZ R12, R12, R13",
    "@!P0 BRA 0x10",  # the back edge
    "EXIT",
]


def test_loop_between_and_after_the_waits():
    functions = sass_loops.parse_functions(_sass("_Z6kernelv", _LOOP))
    (loop,) = sass_loops.wait_loops(functions["_Z6kernelv"])
    assert (loop.start, loop.end, loop.instructions, loop.hgmma) == (0x10, 0xC0, 12, 2)
    assert loop.between_waits == {"MUFU": 1, "FMNMX": 1, "FADD": 0, "FMUL": 0}
    assert loop.after_pv_wait == {"MUFU": 1, "FMNMX": 0, "FADD": 1, "FMUL": 1}


def test_loop_without_both_waits_is_left_out():
    body = [t for t in _LOOP if "DEPBAR.LE gsb0, 0x0" not in t]
    functions = sass_loops.parse_functions(_sass("_Z6kernelv", body))
    assert sass_loops.wait_loops(functions["_Z6kernelv"]) == []


def test_second_listing_of_a_function_is_ignored():
    lines = _sass("_Z1fv", _LOOP) + _sass("_Z1fv", ["NOP"])
    functions = sass_loops.parse_functions(lines)
    assert len(functions["_Z1fv"]) == len(_LOOP)


def test_opcode_drops_predicate_and_modifiers():
    assert sass_loops.opcode("@!P0 FMUL.FTZ R1, R2, R3") == "FMUL"
    assert sass_loops.opcode("@UPT UIADD3 UR4, UR4, 0x1, URZ") == "UIADD3"
    assert sass_loops.opcode("MUFU.EX2 R6, R7") == "MUFU"


def test_branch_forms_with_modifiers_and_operands_close_loops():
    for back_edge in ("@P0 BRA.U.ANY 0x10", "@!P0 BRA P1, 0x10", "BRA.DIV UR8, 0x10", "BRA.U 0x10"):
        body = _LOOP[:-2] + [back_edge, "EXIT"]
        functions = sass_loops.parse_functions(_sass("_Z6kernelv", body))
        (loop,) = sass_loops.wait_loops(functions["_Z6kernelv"])
        assert (loop.start, loop.end) == (0x10, 0xC0), back_edge


def test_only_the_chosen_architectures_code_is_read():
    lines = ["\tcode for sm_80"] + _sass("_Z1fv", ["NOP", "EXIT"])
    lines += ["\tcode for sm_90a"] + _sass("_Z1fv", _LOOP)
    assert len(sass_loops.parse_functions(lines)["_Z1fv"]) == len(_LOOP)
    assert len(sass_loops.parse_functions(lines, arch="sm_80")["_Z1fv"]) == 2


def _check(monkeypatch, body, kernel="kernel"):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(_sass("_Z6kernelv", body))))
    sass_loops.main(["--check", f"--kernel={kernel}", "-"])


def test_check_passes_only_with_the_softmax_between_the_waits(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _check(monkeypatch, _LOOP)  # an exponential after the P V wait
    assert exit_info.value.code == 1
    assert "FAIL: 1 of 1" in capsys.readouterr().out
    _check(monkeypatch, [t for t in _LOOP if t != "MUFU.EX2 R8, R9"])
    assert "OK: 1 kernels" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a check that matched no kernel fails
        _check(monkeypatch, _LOOP, kernel="no_such_kernel")
