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
    # Found by a review of the ops against the functions (2026-12-07): the ops raised
    # AttributeError, ValueError or another message for these.
    "out_type": "paged_attention: out has the wrong type: expected a torch.Tensor, got str",
    "kv_layout_type": "paged_attention: kv_layout has the wrong type",
    "kv_layout_none": "paged_attention: kv_layout has the wrong type",
    "k_scale_bool": "paged_attention: k_scale given without an fp8 KV cache",
    "k_scale_int": "paged_attention: k_scale given without an fp8 KV cache",
    "v_scale_str": "paged_attention: v_scale given without an fp8 KV cache",
    "k_scale_subnormal": "paged_attention: k_scale given without an fp8 KV cache",
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
    elif what in ("out_type", "kv_layout_type", "kv_layout_none", "k_scale_bool",
                  "k_scale_int", "v_scale_str", "k_scale_subnormal"):
        name, value = {"out_type": ("out", "x"), "kv_layout_type": ("kv_layout", 5),
                       "kv_layout_none": ("kv_layout", None), "k_scale_bool": ("k_scale", True),
                       "k_scale_int": ("k_scale", 1), "v_scale_str": ("v_scale", "x"),
                       "k_scale_subnormal": ("k_scale", 1e-40)}[what]
        kwargs[name] = value
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


def test_ragged_op_refuses_an_out_of_the_wrong_type_as_the_function_does():
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    message = "ragged_attention: out has the wrong type: expected a torch.Tensor, got int"
    for call in (splitkv.ragged_attention, splitkv.ops.ragged_attention):
        with pytest.raises(TypeError) as caught:
            call(r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace, out=3)
        assert str(caught.value) == message
    harness.assert_counter_region_zero(workspace)


def _negated(x):
    """A negated view whose values are x's (its memory holds -x)."""
    view = torch.conj(torch.complex(x.float(), -x.float())).imag.to(x.dtype)
    if x.dtype != torch.float32:
        return x  # .to() resolved the bit: only float32 makes a negated view here
    assert view.is_neg() and torch.equal(view, x)
    return view


@pytest.mark.parametrize("name", ["q", "out", "k_scale"])
def test_compiled_call_refuses_a_negated_view(name):
    """Inductor drops the neg bit of a graph input (torch 2.13: even x * 1.0 returns -x), so
    a negated q reached the op as its memory, -q: a silent wrong answer where the eager call
    refuses. The functions now read the bit at trace time (a recompile when it changes)."""
    dtype = torch.bfloat16 if name == "k_scale" else torch.float32
    p = _paged_problem("cpu", dtype=dtype)
    workspace = harness.shared_workspace("cpu")
    kv_cache, options = p.kv_cache, {}
    if name == "k_scale":
        kv_cache = p.kv_cache.to(torch.float8_e4m3fn)
        options = dict(k_scale=torch.full((2,), 2.0), v_scale=1.0)
    step = torch.compile(splitkv.ops.paged_attention, fullgraph=True)
    args = (p.q, kv_cache, p.block_tables, p.seq_lens, workspace)
    good = step(*args, **options)  # compiled first without the bit: the guards must catch it
    harness.assert_bitwise_equal(good, splitkv.paged_attention(*args, **options))
    if name == "q":
        args = (_negated(p.q),) + args[1:]
    elif name == "out":
        options = dict(out=_negated(torch.zeros_like(p.q)))
    else:
        options["k_scale"] = _negated(options["k_scale"])
    message = f"paged_attention: {name} is a negated view"
    with pytest.raises(ValueError, match=message):
        splitkv.paged_attention(*args, **options)
    with pytest.raises(Exception) as caught:  # noqa: B017 - fullgraph: torch's Unsupported
        step(*args, **options)
    assert message in str(caught.value)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("what", ["window_left", "sm_scale", "max_q_len"])
def test_compiled_refusal_of_a_symbolic_option_reads_as_eager(what):
    """An option traced as a symbol (dynamic=True, or changed between calls) that is out of
    range: the functions' trace-time check built its message from the symbol, which Dynamo
    cannot format ("BUILD_STRING type error" / "repr_impl not implemented", without
    splitkv's text). The op now checks the real value: the eager error, type and text."""
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")

    @torch.compile(fullgraph=True, dynamic=True)
    def prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, window_left, sm_scale,
                max_q_len):
        return splitkv.ops.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                                            window_left=window_left, sm_scale=sm_scale,
                                            max_q_len=max_q_len)

    args = (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
    options = dict(window_left=50, sm_scale=0.1, max_q_len=40)
    harness.assert_bitwise_equal(prefill(*args, **options),
                                 splitkv.ragged_attention(*args, **options))
    options[what] = {"window_left": -5, "sm_scale": 1e-39, "max_q_len": 2**31}[what]
    with pytest.raises(ValueError) as eager:
        splitkv.ragged_attention(*args, **options)
    with pytest.raises(ValueError) as compiled:
        prefill(*args, **options)
    assert str(compiled.value) == str(eager.value)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("name", ["q", "out", "lse"])
def test_raw_op_refuses_a_negated_view(name):
    """torch's Negative fallback gave the raw op a resolved copy of q (accepted where the
    functions refuse) and, for out or lse, wrote them and then raised "Expected Tensor but got
    None": the ops' Negative kernel now refuses before anything runs, eager and compiled."""
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args = [r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace.tensor,
            torch.zeros_like(r.q), torch.zeros(r.q.shape[:2]), True, None, -1, 0.0, None, None]
    index = {"q": 0, "out": 6, "lse": 7}[name]
    args[index] = _negated(args[index].clone())
    message = f"ragged_attention: {name} is a negated view"
    with pytest.raises(ValueError, match=message):
        torch.ops.splitkv.ragged_attention(*args)
    assert not args[6].any() and not args[7].any()  # nothing written

    def raw(*args):
        torch.ops.splitkv.ragged_attention(*args)
        return args[6]

    with pytest.raises(Exception) as caught:  # noqa: B017 - torch wraps the fake call's error
        torch.compile(raw, fullgraph=True)(*args)
    assert message in str(caught.value)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("option", [dict(window_left=2**63), dict(max_q_len=-2**63 - 1),
                                    dict(logits_soft_cap=10**400)], ids=str)
def test_compiled_refusal_of_an_option_past_int64_or_float64(option):
    """Refused while tracing, with the eager message: past int64 the op's SymInt cannot carry
    the value (torch's fake-call error otherwise), and float() of an int past float64 raised
    an OverflowError Dynamo cannot catch (InternalTorchDynamoError)."""
    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args = (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
    with pytest.raises(ValueError) as eager:
        splitkv.ragged_attention(*args, **option)
    with pytest.raises(Exception) as compiled:  # noqa: B017 - fullgraph: torch's Unsupported
        torch.compile(splitkv.ops.ragged_attention, fullgraph=True)(*args, **option)
    assert str(eager.value) in str(compiled.value)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_compiled_calls_take_symbolic_ints_for_float_options(dynamic):
    """An int for a float option (logits_soft_cap=30, sm_scale=1: accepted eagerly) that
    changes between calls is traced as a symbolic int, on which real() called hasattr: under
    fullgraph "Unsupported hasattr call", with no splitkv message, for valid input."""
    @torch.compile(fullgraph=True, dynamic=dynamic)
    def prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace, logits_soft_cap, sm_scale):
        return splitkv.ops.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, workspace,
                                            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    r = _ragged_problem("cpu")
    workspace = harness.shared_workspace("cpu")
    args = (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv, workspace)
    for cap, scale in [(30, 1), (20, 2), (10, 3)]:
        harness.assert_bitwise_equal(
            prefill(*args, cap, scale),
            splitkv.ragged_attention(*args, logits_soft_cap=cap, sm_scale=scale))
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


@pytest.mark.parametrize("through", ["function", "runner"])
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_fake_tensors_take_the_op(kind, through):
    """Over fake tensors (torch's FakeTensorMode, as make_fx and shape propagation use) the
    functions and a runner's run() take the custom op, as under torch.compile: fake outputs of
    the real ones' shapes and dtypes, the op in make_fx's graph, and nothing launched (the
    workspace, passed as the traced function's input, keeps a zero counter region). Before,
    the call read the fake tensors' addresses (0) and refused with "out overlaps q"."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    workspace = splitkv.Workspace(32 << 20)
    if kind == "paged":
        p = _paged_problem("cpu")
        tensors = (p.q, p.kv_cache, p.block_tables, p.seq_lens)

        def call(q, kv_cache, block_tables, seq_lens, ws):
            if through == "runner":
                return splitkv.PagedAttentionRunner(ws, block_tables, seq_lens, num_splits=4,
                                                    return_lse=True).run(q, kv_cache)
            return splitkv.paged_attention(q, kv_cache, block_tables, seq_lens, ws, num_splits=4,
                                           return_lse=True)
    else:
        r = _ragged_problem("cpu")
        tensors = (r.q, r.k, r.v, r.cu_seqlens_q, r.cu_seqlens_kv)

        def call(q, k, v, cu_seqlens_q, cu_seqlens_kv, ws):
            if through == "runner":
                return splitkv.RaggedAttentionRunner(ws, cu_seqlens_q, cu_seqlens_kv,
                                                     num_splits=3, return_lse=True).run(q, k, v)
            return splitkv.ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, ws,
                                            num_splits=3, return_lse=True)
    q = tensors[0]
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(x) for x in tensors + (workspace.tensor,)]
        out, lse = call(*fakes)
    assert isinstance(out, FakeTensor) and isinstance(lse, FakeTensor)
    assert (out.shape, out.dtype) == (q.shape, q.dtype)
    assert (lse.shape, lse.dtype) == (q.shape[:2], torch.float32)
    graph = make_fx(call, tracing_mode="fake")(*tensors, workspace.tensor)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert getattr(torch.ops.splitkv, f"{kind}_attention").default in targets
    harness.assert_counter_region_zero(workspace)
