"""The bad-input catalogue (docs/bad_inputs.md): each refused input of bad_inputs.ROWS is
refused with its exact message, leaves the counter region zero, and the next valid call on
the same workspace is right. errors_test.py tests its own rows the same way.

Also the inputs that are accepted with a documented result: an empty batch, zero-length
requests, NaN and infinities in unused KV bytes (never read) and in q, k, v (propagated
to the rows that see them).
"""

import math
import os

import pytest
import torch

import bad_inputs
import errors_test
import harness
import splitkv
import splitkv_reference
from harness import DEVICES

_DTYPE = torch.float16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", bad_inputs.ROWS, ids=[row.id for row in bad_inputs.ROWS])
def test_refused(device, row, request):
    harness.require(device)
    if row.where not in ("any", device):
        pytest.skip(f"refused on {row.where} only")
    if row.id in bad_inputs.PENDING:
        request.applymarker(pytest.mark.xfail(
            strict=True, raises=pytest.fail.Exception,
            reason="python/splitkv/attention.py does not call _checks.workspace_disjoint yet"))
    problem, expected = errors_test._valid(device, row.kind)
    workspace = harness.shared_workspace(device)
    # Twice: a refusal that depends on more than the call's layout (index values, addresses)
    # comes the second time from the per-call path (python/splitkv/_calls.py), same message.
    for _ in range(2):
        with pytest.raises(row.error) as caught:
            row.call(problem, workspace, device)
        assert str(caught.value) == bad_inputs.expected_message(row, problem, device)
        harness.assert_counter_region_zero(workspace)
    # The same workspace then serves a valid split call.
    harness.assert_close(problem.run(workspace, num_splits=3), expected, _DTYPE)
    harness.assert_counter_region_zero(workspace)


def test_every_row_is_documented():
    with open(bad_inputs.DOC) as f:
        text = f.read()
    assert bad_inputs.rewritten(text) == text, (
        "docs/bad_inputs.md's table is stale: run python3 tests/python/bad_inputs.py")


def test_workspace_overlap_check_compares_byte_spans():
    check = splitkv._checks.workspace_disjoint
    base = torch.zeros(4096, dtype=torch.uint8)
    workspace = base[1024:2048]
    check("op", workspace, [("before", base[:1024]), ("after", base[2048:]), ("none", None),
                            ("empty", base[1500:1500])])
    with pytest.raises(ValueError, match=r"^op: workspace overlaps x: expected a buffer sharing "
                       r"no byte with x, got workspace bytes \[1020, 1024\) within x's span"):
        check("op", workspace, [("x", base[2044:2060].view(torch.int32))])
    # Every other element of a float16 tensor whose span covers the workspace's first byte.
    strided = base[:1026].view(torch.float16)[::2]
    with pytest.raises(ValueError, match=r"got workspace bytes \[0, 2\) within y's span"):
        check("op", workspace, [("y", strided[:-1]), ("y", strided)])


# ---- accepted inputs, with the documented result ----

def _after_check(problem, workspace, expected):
    harness.assert_counter_region_zero(workspace)
    harness.assert_close(problem.run(workspace, num_splits=3), expected, _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_empty_batch_gives_empty_results(device, num_splits):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    paged, paged_expected = errors_test._valid(device, "paged")
    out, lse = splitkv.paged_attention(paged.q[:0], paged.kv_cache, paged.block_tables[:0],
                                       paged.seq_lens[:0], workspace, num_splits=num_splits,
                                       return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4) and lse.dtype == torch.float32
    _after_check(paged, workspace, paged_expected)

    ragged, ragged_expected = errors_test._valid(device, "ragged")
    empty = harness.cu_seqlens([], device)  # [0]: no requests
    out, lse = splitkv.ragged_attention(ragged.q[:0], ragged.k[:0], ragged.v[:0], empty, empty,
                                        workspace, num_splits=num_splits, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    _after_check(ragged, workspace, ragged_expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [None, 1, 2, 5])
def test_zero_length_requests(device, num_splits):
    # kv_len 0 (and q_len > kv_len under causal): those rows get 0 and LSE -inf, never NaN;
    # requests with q_len 0 own no rows. The other requests are unaffected.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    options = {"num_splits": num_splits, "return_lse": True}
    for problem in (
            harness.make_paged([0, 40, 0, 3], page_size=16, group=2, dtype=_DTYPE,
                               device=device, seed=41),
            harness.make_paged([0, 40, 5], page_size=16, group=2, q_lens=[2, 0, 7],
                               dtype=_DTYPE, device=device, seed=42),
            harness.make_ragged([3, 0, 5, 2, 0], [0, 0, 50, 1, 9], group=2, dtype=_DTYPE,
                                device=device, seed=43)):
        harness.fill_garbage(workspace)
        kwargs = {"max_q_len": 7} if getattr(problem, "q_lens", None) == [2, 0, 7] else {}
        out, lse = problem.run(workspace, **options, **kwargs)
        expected, expected_lse = problem.reference()
        harness.assert_close(out, expected, _DTYPE)
        harness.assert_lse_close(lse, expected_lse)
        empty_rows = torch.isneginf(expected_lse)
        assert bool(empty_rows.any())
        assert bool((out.cpu()[empty_rows] == 0).all())
        assert not bool(out.isnan().any()) and not bool(lse.isnan().any())
        harness.assert_counter_region_zero(workspace)


def test_index_values_are_checked_without_query_rows():
    # The CPU reads index values on the host: a call whose requests all have q_len 0 (it
    # computes nothing) refuses the same bad values as the call with query rows.
    workspace = harness.shared_workspace("cpu")
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    heads, head_dim = 2, 8
    k, v = torch.randn(4, heads, head_dim), torch.randn(4, heads, head_dim)
    for q_rows in (0, 1):
        q = torch.randn(q_rows, heads, head_dim)
        cu_q = i32(0, q_rows, q_rows)
        with pytest.raises(ValueError, match=r"^ragged_attention: cu_seqlens_kv"):
            splitkv.ragged_attention(q, k, v, cu_q, i32(3, -9, 4), workspace)
        with pytest.raises(ValueError, match=r"^ragged_attention: cu_seqlens_q"):
            splitkv.ragged_attention(q, k, v, i32(0, 7, q_rows), i32(0, 2, 4), workspace)
        harness.assert_counter_region_zero(workspace)
        kv_cache = torch.randn(2, 2, heads, 4, head_dim)
        with pytest.raises(ValueError, match=r"^paged_attention: seq_lens\[0\] out of range"):
            splitkv.paged_attention(q, kv_cache, i32(0, 1).repeat(2, 1), i32(-7, 3), workspace,
                                    cu_seqlens_q=cu_q)
        with pytest.raises(ValueError, match=r"^paged_attention: block_tables\[1\]\[0\] \(a page id\)"):
            splitkv.paged_attention(q, kv_cache, i32(0, 1, 99, -1).view(2, 2), i32(3, 4), workspace,
                                    cu_seqlens_q=cu_q)
        harness.assert_counter_region_zero(workspace)
    # Valid index values without query rows: accepted, nothing written.
    out, lse = splitkv.ragged_attention(torch.randn(0, heads, head_dim), k, v, i32(0, 0, 0),
                                        i32(0, 2, 4), workspace, return_lse=True)
    assert out.shape == (0, heads, head_dim) and lse.shape == (0, heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_unused_kv_bytes_are_never_read(device, value):
    # Page tails, spare pages and the block-table padding column hold `value` (the harness
    # puts NaN there; here every unused byte is overwritten): results stay exact.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([37, 16, 5, 80], page_size=16, group=2, dtype=_DTYPE,
                                 device=device, q_lens=[3, 1, 2, 4], seed=44)
    cache = problem.kv_cache
    cache.masked_fill_(cache.isnan(), value)
    for num_splits in (None, 1, 3):
        out, lse = problem.run(workspace, num_splits=num_splits, return_lse=True, max_q_len=4)
        expected, expected_lse = problem.reference()
        harness.assert_close(out, expected, _DTYPE)
        harness.assert_lse_close(lse, expected_lse)
        harness.assert_counter_region_zero(workspace)


def _poisoned(where, value, device):
    """A ragged problem (2 requests, non-causal) with one non-finite element in `where`:
    q row 1 head 2, or key/value 150 of request 0 in kv head 1 (seen by qo heads 2, 3)."""
    problem = harness.make_ragged([4, 3], [300, 20], group=2, dtype=_DTYPE, device=device,
                                  seed=45)
    if where == "q":
        problem.q[1, 2, 5] = value
    else:
        getattr(problem, where)[150, 1, 5] = value
    return problem


def _nonfinite_rows(out, lse):
    """Rows holding NaN or an infinity: in the output, or a NaN or +inf LSE (an LSE of -inf
    with a zero output is the result of a row that sees no key)."""
    return ~torch.isfinite(out.to(torch.float64)).all(-1) | lse.isnan() | lse.isposinf()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nonfinite_inputs_propagate(device, where, value):
    # Documented: NaN or an infinity in q, k or v is not checked; it propagates into the
    # output or LSE of exactly the rows whose float64 result is not finite (the rows that
    # see it, but for a key whose logit is -inf), whatever num_splits; other rows are exact.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = _poisoned(where, value, device)
    expected, expected_lse = problem.reference(causal=False)
    bad = _nonfinite_rows(expected, expected_lse)
    assert 0 < int(bad.sum()) <= 8
    for num_splits in (1, 2, 5):
        out, lse = problem.run(workspace, causal=False, num_splits=num_splits, return_lse=True,
                               max_q_len=4)
        out, lse = out.cpu(), lse.cpu()
        assert torch.equal(_nonfinite_rows(out, lse), bad), num_splits
        harness.assert_close(out[~bad], expected[~bad], _DTYPE)
        harness.assert_lse_close(lse[~bad], expected_lse[~bad])
        harness.assert_counter_region_zero(workspace)


_LONG_CALLS = {
    # The planner's split, one split (CUDA: the wgmma prefill for the 140-token request's
    # tiles), seven merged splits, and batch-invariant splits (2048 keys on CUDA, 1024 on the
    # CPU: a 5000-key request has 3 or 5, folded inside the wgmma prefill or by the merging
    # CTA), with sinks on the last (the sink enters the merged row once).
    "planned": dict(),
    "one_split": dict(num_splits=1),
    "seven_splits": dict(num_splits=7),
    "invariant": dict(batch_invariant=True),
    "invariant_sinks": dict(batch_invariant=True, sinks=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", list(_LONG_CALLS))
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["q_paged", "q_ragged", "k_ragged"])
def test_nonfinite_logits_propagate_through_every_merge(device, where, value, call):
    # As above over long requests, so that each kernel family and merge a row can take sees
    # the non-finite logit: a row all of whose logits are NaN (q), a split whose logits are all
    # NaN beside finite splits (q), one NaN or infinite logit in a later split (k, key 3000 of
    # request 0). The rows whose float64 result is not finite are exactly those that are not
    # finite here, whatever the split; every other row is as the reference's.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    q_lens, kv_lens = [3, 140], [5000, 2600]
    if where == "q_paged":
        problem = harness.make_paged(kv_lens, page_size=16, group=2, dtype=_DTYPE, device=device,
                                     q_lens=q_lens, seed=46)
    else:
        problem = harness.make_ragged(q_lens, kv_lens, group=2, dtype=_DTYPE, device=device,
                                      seed=46)
    if where.startswith("q"):
        problem.q[1, 2, 5] = value    # request 0, token 1, qo head 2
        problem.q[100, 0, 7] = value  # request 1, token 97, qo head 0
    else:
        problem.k[3000, 1, 5] = value  # request 0's key 3000, kv head 1 (qo heads 2, 3)
    options = dict(_LONG_CALLS[call])
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(4, generator=torch.Generator().manual_seed(3)).to(device)
    expected, expected_lse = problem.reference(causal=False, **options)
    bad = _nonfinite_rows(expected, expected_lse)
    assert int(bad.sum()) > 0
    out, lse = problem.run(workspace, causal=False, return_lse=True, max_q_len=140, **options)
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(_nonfinite_rows(out, lse), bad)
    harness.assert_close(out[~bad], expected[~bad], _DTYPE)
    harness.assert_lse_close(lse[~bad], expected_lse[~bad])
    harness.assert_counter_region_zero(workspace)


_HIDDEN_KEY_CALLS = {"one_split": dict(num_splits=1), "two_splits": dict(num_splits=2),
                     "invariant": dict(batch_invariant=True)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", list(_HIDDEN_KEY_CALLS))
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("kind", ["prefill", "verify"])
def test_nonfinite_key_hidden_from_earlier_rows(device, kind, where, value, call, request):
    # Under the causal mask a key is hidden from the rows before it, which must stay exact,
    # though they share its key block and query tile with rows that see it: a ragged prefill
    # of 150 tokens with key 70 poisoned (tokens 0..69 do not see it), and a speculative-decode
    # verify of 4 tokens over a paged cache of 150 keys with key 147 poisoned (the first token,
    # at position 146, does not see it). The rows after get what the float64 reference gets.
    harness.require(device)
    if device == "cuda" and where == "v":
        # Measured on an H100 (session 59): a hidden row's weight is an exact 0, but the
        # tensor-core P V product of its tile multiplies it by the value: 0 x NaN (or inf) is
        # NaN. No per-row mask reaches inside that product; docs/bad_inputs.md says so.
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="CUDA: a non-finite value reaches the rows of its query tile "
                                "that the mask hides it from (0 x NaN in the P V product)"))
    workspace = harness.shared_workspace(device)
    if kind == "prefill":
        problem = harness.make_ragged([150], [150], group=4, head_dim=128, dtype=_DTYPE,
                                      device=device, seed=3)
        getattr(problem, where)[70, 1, 9] = value
        first_seeing = 70
    else:
        problem = harness.make_paged([150], page_size=16, group=4, head_dim=128, dtype=_DTYPE,
                                     device=device, q_lens=[4], seed=3)
        position, part = 147, 0 if where == "k" else 1
        page = int(problem.block_tables[0, position // 16])
        problem.kv_cache[page, part, 1, position % 16, 9] = value  # HND
        (problem.keys if where == "k" else problem.values)[0][position, 1, 9] = value
        first_seeing = 1
    expected, expected_lse = problem.reference()
    bad = _nonfinite_rows(expected, expected_lse)
    assert bool(bad[first_seeing:, 4:].any()) and not bool(bad[:first_seeing].any())
    out, lse = problem.run(workspace, return_lse=True, **_HIDDEN_KEY_CALLS[call])
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(_nonfinite_rows(out, lse), bad)
    harness.assert_close(out[~bad], expected[~bad], _DTYPE)
    harness.assert_lse_close(lse[~bad], expected_lse[~bad])
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "invariant"])
@pytest.mark.parametrize("all_keys", [False, True], ids=["one_split", "whole_row"])
def test_nonfinite_value_behind_minus_inf_logits_propagates(batch_invariant, all_keys):
    # A visible key whose scaled logit overflows to -inf has weight 0, and 0 x inf is NaN
    # (splitkv_reference: "a visible key whose weight underflows still spreads NaN"). CPU:
    # batch_invariant's merge skipped an invariant split (1024 keys) whose logits were all
    # -inf, and with it the NaN of an infinite value there: the row came back finite.
    workspace = harness.shared_workspace("cpu")
    head_dim, kv_len = 64, 2048
    q = torch.zeros(1, 1, head_dim)
    q[0, 0, 0] = 1.0
    k = torch.zeros(kv_len, 1, head_dim)
    k[:, 0, 1] = 1.0  # q . k = 0: logit 0
    k[0 if all_keys else 1024:, 0, 0] = -2.0  # q . k = -2: logit -6e38, -inf in float32
    v = torch.randn(kv_len, 1, head_dim, generator=torch.Generator().manual_seed(7))
    v[1500, 0, 3] = float("inf")  # in the second invariant split of 1024 keys
    cu_q = torch.tensor([0, 1], dtype=torch.int32)
    cu_kv = torch.tensor([0, kv_len], dtype=torch.int32)
    out, lse = splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace, causal=False,
                                        sm_scale=3e38, return_lse=True,
                                        batch_invariant=batch_invariant)
    if all_keys:
        # Every logit -inf: the row reads as one that sees no key (out 0, LSE -inf), but
        # for the element the infinite value enters. (The float64 reference, whose logits
        # do not overflow, weighs the keys equally: out[3] is inf there.)
        assert lse.item() == float("-inf")
        assert out[0, 0, 3].isnan()
        assert int((out[0, 0] == 0).sum()) == head_dim - 1
    else:
        expected, expected_lse = splitkv_reference.ragged_attention(
            q, k, v, cu_q, cu_kv, causal=False, sm_scale=3e38)
        assert expected[0, 0, 3].isnan() and int(torch.isfinite(expected).sum()) == head_dim - 1
        assert out[0, 0, 3].isnan()
        keep = torch.arange(head_dim) != 3
        torch.testing.assert_close(out[0, 0, keep].double(), expected[0, 0, keep], atol=2e-5,
                                   rtol=2e-5)
        torch.testing.assert_close(lse.double(), expected_lse, atol=1e-4, rtol=2e-5)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "invariant"])
@pytest.mark.parametrize("all_keys", [False, True], ids=["half_the_keys", "whole_row"])
def test_infinite_value_behind_overflowed_logits(device, batch_invariant, all_keys, request):
    # The test above's case in bfloat16 from finite inputs, on both backends: q . k =
    # 1e20 x -1e20 overflows float32 to -inf for keys [2048, 4096) (or every key), a whole
    # number of invariant splits on either backend (1024 keys on the CPU, 2048 on CUDA);
    # an infinite value sits at key 3000. Its weight is 0 and 0 x inf is NaN: out[3] NaN.
    harness.require(device)
    if device == "cuda":
        # Measured on an H100 (session 56, docs/bad_inputs.md): one split keeps the NaN, but
        # the merge leaves out a split whose logits are all -inf (NaN and all), and a row
        # with no finite logit is written as 0.
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="CUDA drops a NaN behind -inf logits: in a split the merge "
                                "leaves out, or in a row with no finite logit"))
    workspace = harness.shared_workspace(device)
    head_dim, kv_len = 64, 4096
    q = torch.zeros(1, 1, head_dim, dtype=torch.bfloat16)
    q[0, 0, 0], q[0, 0, 1] = 1e20, 1.0
    k = torch.zeros(kv_len, 1, head_dim, dtype=torch.bfloat16)
    k[:, 0, 1] = 0.5  # q . k = 0.5 for the keys that do not overflow
    k[0 if all_keys else 2048:, 0, 0] = -1e20
    v = torch.randn(kv_len, 1, head_dim, generator=torch.Generator().manual_seed(7)).to(
        torch.bfloat16)
    v[3000, 0, 3] = float("inf")
    cu_q = torch.tensor([0, 1], dtype=torch.int32)
    cu_kv = torch.tensor([0, kv_len], dtype=torch.int32)
    q, k, v, cu_q, cu_kv = (x.to(device) for x in (q, k, v, cu_q, cu_kv))
    for num_splits in ((None,) if batch_invariant else (None, 1, 2, 4)):
        out, lse = splitkv.ragged_attention(q, k, v, cu_q, cu_kv, workspace, causal=False,
                                            return_lse=True, num_splits=num_splits,
                                            batch_invariant=batch_invariant, max_q_len=1)
        out, lse = out.cpu()[0, 0], lse.cpu()[0, 0]
        assert out[3].isnan(), (num_splits, out[3])
        keep = torch.arange(head_dim) != 3
        if all_keys:
            # Every logit -inf: a row that sees no key (out 0, LSE -inf) but for element 3.
            assert lse.item() == float("-inf"), num_splits
            assert torch.equal(out[keep], torch.zeros(head_dim - 1, dtype=out.dtype))
        else:
            expected = v[:2048, 0].cpu().double().mean(0)  # equal weights over keys 0-2047
            harness.assert_close(out[keep], expected[keep], torch.bfloat16)
            assert abs(lse.item() - (0.5 / 8.0 + math.log(2048))) < 1e-3, (num_splits, lse)
        harness.assert_counter_region_zero(workspace)


def test_doc_file_is_where_the_catalogue_writes():
    assert os.path.exists(bad_inputs.DOC), bad_inputs.DOC
