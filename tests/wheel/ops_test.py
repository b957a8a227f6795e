"""splitkv.ops: the torch.library custom ops, eager, under torch.compile(fullgraph=True), and
captured in a CUDA graph (gpu)."""

import os

import pytest
import torch

import harness
import splitkv

# Inductor compiles C++ for the CPU: keep its cache inside the test's own directory.
_TMP = os.environ.get("TEST_TMPDIR", "/tmp")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP, "inductor"))

OPTIONS = dict(num_splits=4, return_lse=True)


def _paged_problem(device, seq_lens=(1, 97, 300), dtype=torch.float32, kv_form="5d"):
    return harness.make_paged(list(seq_lens), page_size=16, num_kv_heads=2, group=2,
                              head_dim=64 if device == "cpu" else 128, dtype=dtype,
                              device=device, kv_form=kv_form)


def _ragged_problem(device, dtype=torch.float32):
    return harness.make_ragged([3, 0, 40], [3, 7, 200], num_kv_heads=2, group=2,
                               head_dim=64 if device == "cpu" else 128, dtype=dtype,
                               device=device)


def _mutated_args(op):
    return sorted(a.name for a in op._schema.arguments
                  if a.alias_info is not None and a.alias_info.is_write)


@pytest.mark.parametrize("name", ["paged_attention", "ragged_attention"])
def test_schema_declares_workspace_out_and_lse_mutated(name):
    op = getattr(torch.ops.splitkv, name).default
    assert _mutated_args(op) == ["lse", "out", "workspace"]
    assert len(op._schema.returns) == 0


def _paged_op_args(device):
    p = _paged_problem(device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    workspace = splitkv.Workspace(32 << 20, device)
    out = torch.empty_like(p.q)
    lse = torch.empty(p.q.shape[:2], dtype=torch.float32, device=device)
    return workspace, (p.q, p.kv_cache, None, p.block_tables, p.seq_lens, workspace.tensor, out,
                       lse, None, "HND", None, True, -1, 0.0, 4, None)


def _ragged_op_args(device):
    r = _ragged_problem(device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    workspace = splitkv.Workspace(32 << 20, device)
    out = torch.empty_like(r.q)
    return workspace, (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace.tensor, out, None,
                       True, None, -1, 0.0, 3, None)


@pytest.mark.parametrize("make_args", [_paged_op_args, _ragged_op_args])
def test_schema_check_mode_finds_no_undeclared_mutation(make_args):
    """torch's schema check on the caller's own arguments (torch.library.opcheck would run it
    on copies, whose workspace loses its 256-byte alignment on the CPU: torch's allocator
    aligns to 64 and the copies keep only the address modulo 32)."""
    from torch._subclasses.schema_check_mode import SchemaCheckMode

    workspace, args = make_args("cpu")
    op = (torch.ops.splitkv.paged_attention.default if make_args is _paged_op_args
          else torch.ops.splitkv.ragged_attention.default)
    with SchemaCheckMode():
        op(*args)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.gpu
@pytest.mark.parametrize("make_args", [_paged_op_args, _ragged_op_args])
def test_opcheck_on_cuda(make_args):
    """torch.library.opcheck: schema (mutations declared), fake impl, AOT dispatch with
    static and dynamic shapes. On CUDA the copies it makes stay 256-byte aligned."""
    harness.require("cuda")
    workspace, args = make_args("cuda")
    op = (torch.ops.splitkv.paged_attention.default if make_args is _paged_op_args
          else torch.ops.splitkv.ragged_attention.default)
    torch.library.opcheck(op, args)
    harness.assert_counter_region_zero(workspace)


def test_only_declared_arguments_change():
    """The op writes out, lse and the workspace (declared mutable), nothing else."""
    p = _paged_problem("cpu", kv_form="pair")
    workspace = splitkv.Workspace(32 << 20)
    out = torch.full_like(p.q, float("nan"))
    lse = torch.full(p.q.shape[:2], float("nan"))
    inputs = (p.q, p.kv_cache[0], p.kv_cache[1], p.block_tables, p.seq_lens)
    before = [x.clone() for x in inputs]
    workspace_before = workspace.tensor.clone()
    torch.ops.splitkv.paged_attention(*inputs, workspace.tensor, out, lse, None, "HND", None,
                                      True, -1, 0.0, 4, None)
    for x, y in zip(inputs, before):
        harness.assert_bitwise_equal(x, y)  # NaN padding included
    assert not out.isnan().any() and not lse.isnan().any()
    # The softmax and scratch regions were written (4 splits); the counters are zero again.
    assert not torch.equal(workspace.tensor, workspace_before)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("kv_form", ["5d", "pair"])
def test_eager_ops_match_the_functions_bitwise(kv_form):
    p = _paged_problem("cpu", kv_form=kv_form)
    workspace = harness.shared_workspace("cpu")
    expected = p.run(workspace, **OPTIONS)
    got = splitkv.ops.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace,
                                      kv_layout=p.kv_layout, **OPTIONS)
    for a, b in zip(got, expected):
        harness.assert_bitwise_equal(a, b)
    harness.assert_counter_region_zero(workspace)


def test_out_is_written_in_place_and_returned():
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    out = torch.full_like(r.q, float("nan"))
    got = splitkv.ops.ragged_attention(r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace,
                                       out=out)
    assert got is out
    harness.assert_close(out, r.reference()[0], r.dtype)


def _paged_compiled():
    @torch.compile(fullgraph=True)
    def step(q, kv_cache, block_tables, seq_lens, workspace):
        out, lse = splitkv.ops.paged_attention(q, kv_cache, block_tables, seq_lens, workspace,
                                               **OPTIONS)
        # A pointwise op after the custom op: inductor also compiles a C++ kernel here.
        return out * 2.0, lse
    return step


def test_compiled_paged_matches_reference_and_reuses_the_callers_workspace(monkeypatch):
    """fullgraph: no graph break; the launcher gets the caller's workspace (no copy); a second
    batch size (recompiled, dynamic shapes) works too; counters stay zero."""
    seen = []
    launch = splitkv._splitkv.LaunchPagedAttention

    def recording_launch(params):
        seen.append(params.workspace.data)
        return launch(params)

    monkeypatch.setattr(splitkv._splitkv, "LaunchPagedAttention", recording_launch)
    workspace = harness.shared_workspace("cpu")
    step = _paged_compiled()
    for seq_lens in [(1, 97, 300), (33, 5, 700, 16, 2)]:
        p = _paged_problem("cpu", seq_lens=seq_lens)
        harness.fill_garbage(workspace)
        out, lse = step(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace)
        ref_out, ref_lse = p.reference()
        harness.assert_close(out / 2.0, ref_out, p.dtype)
        harness.assert_lse_close(lse, ref_lse)
        harness.assert_counter_region_zero(workspace)
        eager = p.run(workspace, **OPTIONS)
        harness.assert_bitwise_equal(out / 2.0, eager[0])
    assert seen and set(seen) == {workspace.tensor.data_ptr()}


def test_compiled_ragged_matches_reference():
    @torch.compile(fullgraph=True)
    def prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace):
        return splitkv.ops.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                                            num_splits=3, return_lse=True)

    r = _ragged_problem("cpu", dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cpu")
    out, lse = prefill(r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
    ref_out, ref_lse = r.reference()
    harness.assert_close(out, ref_out, r.dtype)
    harness.assert_lse_close(lse, ref_lse)
    harness.assert_counter_region_zero(workspace)


def test_plain_functions_compile_through_the_ops():
    """splitkv.paged_attention / ragged_attention themselves work under fullgraph compile."""
    @torch.compile(fullgraph=True)
    def step(q, kv_cache, block_tables, seq_lens, rq, rk, rv, cu_q, cu_kv, workspace):
        decode = splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, workspace,
                                         num_splits=2)
        prefill = splitkv.ragged_attention(rq, rk, rv, cu_q, cu_kv, workspace, num_splits=3,
                                           max_q_len=int(rq.shape[0]))
        return decode, prefill

    p = _paged_problem("cpu", dtype=torch.bfloat16)
    r = _ragged_problem("cpu", dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cpu")
    decode, prefill = step(p.q, p.kv_cache, p.block_tables, p.seq_lens, r.q, r.k, r.v,
                           r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
    harness.assert_close(decode, p.reference()[0], p.dtype)
    harness.assert_close(prefill, r.reference()[0], r.dtype)
    harness.assert_counter_region_zero(workspace)


def test_runners_compile_through_the_ops():
    """PagedAttentionRunner.run / RaggedAttentionRunner.run under fullgraph compile, made
    outside the compiled function (their bound tensors are the runner's): bitwise eager."""
    p = _paged_problem("cpu", dtype=torch.bfloat16)
    r = _ragged_problem("cpu", dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cpu")
    paged = splitkv.PagedAttentionRunner(workspace, p.block_tables, p.seq_lens, num_splits=2)
    ragged = splitkv.RaggedAttentionRunner(workspace, r.cu_seqlens_q, r.cu_seqlens_kv,
                                           num_splits=3, max_q_len=int(r.q.shape[0]))

    @torch.compile(fullgraph=True)
    def step(q, kv_cache, rq, rk, rv):
        return paged.run(q, kv_cache), ragged.run(rq, rk, rv)

    decode, prefill = step(p.q, p.kv_cache, r.q, r.k, r.v)
    harness.assert_bitwise_equal(decode, paged.run(p.q, p.kv_cache))
    harness.assert_bitwise_equal(prefill, ragged.run(r.q, r.k, r.v))
    harness.assert_close(decode, p.reference()[0], p.dtype)
    harness.assert_close(prefill, r.reference()[0], r.dtype)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_compiled_calls_take_symbolic_scalars(dynamic):
    """An int option that changes between calls (a server's max_q_len per batch) becomes a
    symbol on the recompile (or at once with dynamic=True): the checks take it as an int
    (Dynamo could not trace their hasattr on it) and each call equals the eager one bitwise."""
    @torch.compile(fullgraph=True, dynamic=dynamic, backend="eager")
    def prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, max_q_len, window_left,
                num_splits):
        return splitkv.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                                        max_q_len=max_q_len, window_left=window_left,
                                        num_splits=num_splits, return_lse=True)

    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    for max_q_len, window_left, num_splits in [(40, 50, 2), (41, 60, 3), (57, 70, 4), (40, 9, 2)]:
        args = (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
        options = dict(max_q_len=max_q_len, window_left=window_left, num_splits=num_splits)
        got = prefill(*args, **options)
        eager = splitkv.ragged_attention(*args, return_lse=True, **options)
        harness.assert_bitwise_equal(got[0], eager[0])
        harness.assert_bitwise_equal(got[1], eager[1])
        harness.assert_close(got[0], r.reference(window_left=window_left)[0], r.dtype)
        harness.assert_counter_region_zero(workspace)


def test_trace_time_refusals():
    """A refusal of an option raised while Dynamo traces: without fullgraph torch runs the
    call eagerly, so the error is splitkv's own; with fullgraph torch reports it as its
    Unsupported ("Observed exception"), whose text carries splitkv's message (ops.py)."""
    p = _paged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args = (p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace)
    message = ("paged_attention: num_splits out of range: expected None (the planner chooses) "
               "or an int >= 1, got 0")
    with pytest.raises(ValueError) as caught:
        torch.compile(splitkv.ops.paged_attention, backend="eager")(*args, num_splits=0)
    assert str(caught.value) == message
    with pytest.raises(Exception) as caught:  # noqa: B017 - torch's own exception class
        torch.compile(splitkv.ops.paged_attention, fullgraph=True, backend="eager")(
            *args, num_splits=0)
    assert message in str(caught.value)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("name", ["causal", "return_lse", "batch_invariant"])
def test_trace_time_refusal_of_a_tensor_flag(name):
    """A flag passed as a tensor is refused under fullgraph with splitkv's message too (the
    message names the tensor by dtype and shape: its repr, its values, cannot be traced)."""
    p = _paged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    message = (f"paged_attention: {name} has the wrong type: expected a bool, got a torch.bool "
               "tensor of shape ()")

    def call(q, kv_cache, block_tables, seq_lens, workspace, flag):
        return splitkv.ops.paged_attention(q, kv_cache, block_tables, seq_lens, workspace, **{name: flag})

    args = (p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace, torch.tensor(True))
    with pytest.raises(TypeError) as caught:
        call(*args)
    assert str(caught.value) == message
    with pytest.raises(Exception) as caught:  # noqa: B017 - torch's own exception class
        torch.compile(call, fullgraph=True, backend="eager")(*args)
    assert message in str(caught.value)
    harness.assert_counter_region_zero(workspace)


# Bad arguments of a paged call: what is wrong -> how the message starts.
BAD_PAGED = {
    "seq_lens_int64": "paged_attention: seq_lens dtype unsupported",
    "kv_layout": "paged_attention: kv_layout unknown",
    "causal": "paged_attention: causal has the wrong type",
    "window_left": "paged_attention: window_left out of range",
    "num_splits": "paged_attention: num_splits out of range",
    "max_q_len": "paged_attention: max_q_len out of range",
    "q_rank": "paged_attention: q has the wrong number of dimensions",
    "workspace_dtype": "paged_attention: workspace dtype unsupported",
    "kv_pair_length": "paged_attention: kv_cache has the wrong length",
}


def _bad_paged_call(p, workspace, what):
    args = [p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace]
    kwargs = {}
    if what == "seq_lens_int64":
        args[3] = p.seq_lens.to(torch.int64)
    elif what == "q_rank":
        args[0] = p.q[0]
    elif what == "workspace_dtype":
        args[4] = torch.zeros(splitkv.COUNTER_REGION_BYTES // 4, dtype=torch.float32)
    elif what == "kv_pair_length":
        args[1] = (p.kv_cache[:, 0], p.kv_cache[:, 1], p.kv_cache[:, 1])
    else:
        kwargs[what] = {"kv_layout": "HDN", "causal": "yes", "window_left": -2, "num_splits": 0,
                        "max_q_len": 0}[what]
    return args, kwargs


@pytest.mark.parametrize("what", sorted(BAD_PAGED))
def test_errors_read_the_same_as_the_eager_function(what):
    p = _paged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args, kwargs = _bad_paged_call(p, workspace, what)
    with pytest.raises((TypeError, ValueError)) as eager:
        splitkv.paged_attention(*args, **kwargs)
    with pytest.raises((TypeError, ValueError)) as through_op:
        splitkv.ops.paged_attention(*args, **kwargs)
    assert str(eager.value).startswith(BAD_PAGED[what])
    assert type(through_op.value) is type(eager.value)
    assert str(through_op.value) == str(eager.value)
    harness.assert_counter_region_zero(workspace)


def test_errors_read_the_same_when_compiled():
    p = _paged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args = (p.q, p.kv_cache, p.block_tables, p.seq_lens.to(torch.int64), workspace)
    with pytest.raises(TypeError) as eager:
        splitkv.paged_attention(*args)
    compiled = torch.compile(splitkv.ops.paged_attention, fullgraph=True)
    with pytest.raises(TypeError) as when_compiled:
        compiled(*args)
    assert str(eager.value) in str(when_compiled.value)
    harness.assert_counter_region_zero(workspace)


def test_raw_op_checks_the_lse_buffer():
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    out = torch.empty_like(r.q)
    lse = torch.empty(r.q.shape[0], r.q.shape[1] + 1)
    with pytest.raises(ValueError, match=r"ragged_attention: lse shape mismatch: expected "
                                         r"\(43, 4\) \(\[total_q, num_qo_heads\] of q\), got \(43, 5\)"):
        torch.ops.splitkv.ragged_attention(r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv,
                                           workspace.tensor, out, lse, True, None, -1, 0.0, None,
                                           None)


@pytest.mark.gpu
def test_cuda_graph_replays_the_ops():
    harness.require("cuda")
    p = _paged_problem("cuda", seq_lens=(5, 700, 2049), dtype=torch.bfloat16)
    r = _ragged_problem("cuda", dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cuda")
    out_p, out_r = torch.empty_like(p.q), torch.empty_like(r.q)
    lse_p = torch.empty(p.q.shape[:2], dtype=torch.float32, device="cuda")

    def step():
        splitkv.ops.paged_attention(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace,
                                    out=out_p, num_splits=4, max_q_len=1)
        torch.ops.splitkv.paged_attention(p.q, p.kv_cache, None, p.block_tables, p.seq_lens,
                                          workspace.tensor, out_p, lse_p, None, "HND", None, True,
                                          -1, 0.0, 4, 1)
        splitkv.ops.ragged_attention(r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace,
                                     out=out_r, num_splits=3, max_q_len=40)

    step()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(3):
        p.q.copy_(torch.randn_like(p.q))
        graph.replay()
        torch.cuda.synchronize()
        harness.assert_counter_region_zero(workspace)
        ref_out, ref_lse = p.reference()
        harness.assert_close(out_p, ref_out, p.dtype)
        harness.assert_lse_close(lse_p, ref_lse)
        harness.assert_close(out_r, r.reference()[0], r.dtype)


@pytest.mark.gpu
def test_compiled_ops_on_cuda():
    harness.require("cuda")
    p = _paged_problem("cuda", dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cuda")
    out, lse = _paged_compiled()(p.q, p.kv_cache, p.block_tables, p.seq_lens, workspace)
    ref_out, ref_lse = p.reference()
    harness.assert_close(out / 2.0, ref_out, p.dtype)
    harness.assert_lse_close(lse, ref_lse)
    harness.assert_counter_region_zero(workspace)
