"""The CPU backend's three kernel builds (baseline x86-64, AVX2+FMA, AVX-512), each forced by
SPLITKV_CPU_ISA (read at every call; a build the CPU lacks falls back to the best it runs),
against the float64 reference: causal prefill long enough for the many-row kernels and
their masked diagonal blocks, decode over a paged cache, a non-finite key or value that
some rows of one tile see and others do not, a non-finite value behind -inf logits, and
bfloat16 denormals (or tiny products) that the AVX-512 BF16 dot product would flush."""

import math

import pytest
import torch

import harness

ISAS = ["baseline", "avx2", "avx512"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def isa(request, monkeypatch):
    monkeypatch.setenv("SPLITKV_CPU_ISA", request.param)
    return request.param


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 40])
@pytest.mark.parametrize("options", [{}, {"window_left": 50, "logits_soft_cap": 2.0},
                                     {"causal": False}], ids=["causal", "window+cap", "full"])
def test_prefill_matches_reference(isa, dtype, head_dim, options):
    # group 4: 16 tokens x 4 heads = 64 rows a tile; 200 tokens end inside a 64-key block.
    problem = harness.make_ragged([200, 67, 3], [200, 90, 3], group=4, head_dim=head_dim, dtype=dtype,
                                  strided=head_dim == 64, seed=head_dim)
    workspace = harness.shared_workspace("cpu")
    expected, expected_lse = problem.reference(**options)
    for num_splits in (1, 3):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, **options)
        harness.assert_close(out, expected, dtype)
        harness.assert_lse_close(lse, expected_lse)
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("q_lens", [None, [2, 1, 3]], ids=["decode", "multi-token"])
def test_paged_decode_matches_reference(isa, dtype, q_lens):
    problem = harness.make_paged([700, 129, 17], page_size=16, group=4, head_dim=128, dtype=dtype,
                                 q_lens=q_lens, seed=7)
    workspace = harness.shared_workspace("cpu")
    expected, expected_lse = problem.reference()
    for num_splits in (1, None):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, max_q_len=3)
        harness.assert_close(out, expected, dtype)
        harness.assert_lse_close(lse, expected_lse)
        harness.assert_counter_region_zero(workspace)


def _nonfinite_rows(out, lse):
    return ~torch.isfinite(out.to(torch.float64)).all(-1) | lse.isnan() | lse.isposinf()


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_key_seen_by_part_of_a_tile(isa, where, value):
    # Token 70 sits inside the tile of tokens 64..79: under the causal mask its earlier rows
    # do not see key 70 and must stay exact; the later ones get what the reference gets.
    problem = harness.make_ragged([150], [150], group=4, head_dim=128, dtype=torch.float32, seed=3)
    getattr(problem, where)[70, 1, 9] = value
    expected, expected_lse = problem.reference()
    bad = _nonfinite_rows(expected, expected_lse)
    assert bool(bad[70:, 4:].any()) and not bool(bad[:70].any())
    workspace = harness.shared_workspace("cpu")
    for num_splits in (1, 2):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True)
        assert torch.equal(_nonfinite_rows(out, lse), bad), num_splits
        harness.assert_close(out[~bad], expected[~bad], torch.float32)
        harness.assert_lse_close(lse[~bad], expected_lse[~bad])
        harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("q_lens", [[1, 2], [150]], ids=["decode", "prefill"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_value_behind_neg_inf_logits(isa, q_lens, value):
    # Keys 0..63 get logit -inf (q[..., 0] > 0, k[..., 0] = -inf) and key 5 a non-finite
    # value: its weight is 0, and 0 * NaN (or inf) is NaN, so every row that sees key 5 is
    # non-finite in the reference, whatever its other keys, the kernel or num_splits (rows
    # that see only keys 0..63 keep LSE -inf). A row with no finite logit yet once skipped
    # its values, so this depended on both.
    decode = len(q_lens) > 1  # request 1 (keys 200..329) sees none of this
    problem = harness.make_ragged(q_lens, [200, 130] if decode else [150], group=2 if decode else 4,
                                  head_dim=64, dtype=torch.float32, seed=11)
    problem.q[..., 0] = 1.0
    problem.k[:64, :, 0] = float("-inf")
    problem.v[5, :, 3] = value
    workspace = harness.shared_workspace("cpu")
    for causal in (True, False):
        expected, expected_lse = problem.reference(causal=causal)
        bad = _nonfinite_rows(expected, expected_lse) | expected.isnan().any(-1)
        assert bool(bad.any()) and not (causal and bool(bad.all()))
        for num_splits in (1, 2, 5):
            out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, causal=causal)
            got = _nonfinite_rows(out, lse) | out.isnan().any(-1)
            assert torch.equal(got, bad), (causal, num_splits)
            harness.assert_close(out[~bad], expected[~bad], torch.float32)
            harness.assert_lse_close(lse[~bad], expected_lse[~bad])
            harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("case", ["denormal_q", "tiny_products"])
def test_bfloat16_prefill_keeps_denormals(isa, case):
    # The AVX-512 BF16 dot product (VDPBF16PS) reads denormals as 0 and flushes results
    # below 2^-126, whatever MXCSR says: a denormal q times a huge k (logits of order 1),
    # or products of tiny normal values under a huge sm_scale, must still count.
    problem = harness.make_ragged([40], [100], group=1, head_dim=64, dtype=torch.bfloat16, seed=5)
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(problem.q.shape, generator=generator)
    k = torch.randn(problem.k.shape, generator=generator)
    options = {"causal": False}
    if case == "denormal_q":
        problem.q.copy_((q * 5e-39).to(torch.bfloat16))
        problem.k.copy_((k * 2e37).to(torch.bfloat16))
        options["sm_scale"] = 1.0
    else:
        problem.q.copy_((q * 3e-20).to(torch.bfloat16))
        problem.k.copy_((k * 3e-20).to(torch.bfloat16))
        options["sm_scale"] = 1e38
    expected, expected_lse = problem.reference(**options)
    # Not a uniform softmax (LSE log(100)), which is what dropping those products gives.
    assert float(expected_lse.mean()) > math.log(100) + 0.1
    workspace = harness.shared_workspace("cpu")
    for num_splits in (1, 2):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, **options)
        harness.assert_close(out, expected, torch.bfloat16)
        torch.testing.assert_close(lse.to(torch.float64), expected_lse, atol=2e-3, rtol=1e-3)
        harness.assert_counter_region_zero(workspace)
