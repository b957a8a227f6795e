"""The per-call path (python/splitkv/_calls.py): a call whose layout was validated before
launches the same work as the full path, and refuses what the full path refuses, with the
same message.

Each test empties the layout cache first, so the first call of a layout takes the full
path and the next ones the cached one.
"""

import re

import pytest
import torch

import harness
import splitkv
from harness import DEVICES
from splitkv import _calls

_DTYPE = torch.float16


@pytest.fixture(autouse=True)
def _empty_cache():
    _calls._layouts.clear()
    yield
    _calls._layouts.clear()


def _paged_cases(device):
    yield "5d", harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE,
                                   device=device), {}
    yield "pair_nhd", harness.make_paged([33, 5], page_size=16, group=4, dtype=_DTYPE,
                                         device=device, kv_layout="NHD", kv_form="pair"), {}
    yield "cu_seqlens_q", harness.make_paged([40, 30], page_size=16, q_lens=[3, 2],
                                             dtype=_DTYPE, device=device), {"max_q_len": 3}
    yield "split_lse", harness.make_paged([64, 50], page_size=16, group=2, dtype=_DTYPE,
                                          device=device), {"num_splits": 3, "return_lse": True}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["5d", "pair_nhd", "cu_seqlens_q", "split_lse"])
def test_paged_cached_call_equals_full_path(device, case):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    name, problem, options = next(c for c in _paged_cases(device) if c[0] == case)
    first = problem.run(workspace, **options)  # the full path; remembers the layout
    assert len(_calls._layouts) == 1
    second = problem.run(workspace, **options)  # the cached path
    for a, b in zip(first if isinstance(first, tuple) else (first,),
                    second if isinstance(second, tuple) else (second,)):
        assert torch.equal(a, b)
    # Another q of the same layout, into a caller's NaN-poisoned out: bitwise the full
    # path's result for that q.
    q = torch.randn(problem.q.shape, generator=torch.Generator().manual_seed(5))
    problem.q = q.to(_DTYPE).to(device)
    out = torch.full_like(problem.q, float("nan"))
    cached = problem.run(workspace, out=out, **options)
    _calls._layouts.clear()
    full = problem.run(workspace, out=torch.full_like(out, float("nan")), **options)
    for a, b in zip(cached if isinstance(cached, tuple) else (cached,),
                    full if isinstance(full, tuple) else (full,)):
        assert torch.equal(a, b)
    expected = problem.reference(**options)
    harness.assert_close(out, expected[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_cached_call_equals_full_path(device):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_ragged([30, 0, 8], [200, 3, 8], group=4, dtype=_DTYPE, device=device,
                                  strided=True)
    full = problem.run(workspace, num_splits=4, return_lse=True)
    assert len(_calls._layouts) == 1
    for _ in range(2):
        cached = problem.run(workspace, num_splits=4, return_lse=True)
        assert torch.equal(cached[0], full[0]) and torch.equal(cached[1], full[1])
    expected, expected_lse = problem.reference()
    harness.assert_close(cached[0], expected, _DTYPE)
    harness.assert_lse_close(cached[1], expected_lse)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_cached_layout_still_refuses_overlaps(device):
    # The overlap checks depend on addresses, not on the layout: a call of a cached layout
    # whose out is q, or whose workspace holds q, is refused with the full path's message.
    harness.require(device)
    problem = harness.make_paged([40, 17, 64], page_size=16, dtype=_DTYPE, device=device)
    buffer = torch.zeros((24 << 20) + 256, dtype=torch.uint8, device=device)
    skip = -buffer.data_ptr() % 256
    workspace = buffer[skip:skip + (24 << 20)]
    problem.run(workspace, out=torch.empty_like(problem.q))
    with pytest.raises(ValueError, match=r"^paged_attention: out overlaps q: expected a tensor "
                       r"sharing no byte with q, got out bytes \[0, 768\) within q's span; "
                       r"attention is not computed in place$"):
        problem.run(workspace, out=problem.q)
    q_bytes = problem.q.numel() * problem.q.element_size()
    inside = workspace[-q_bytes:].view(_DTYPE).view(problem.q.shape)
    inside.copy_(problem.q)
    q, problem.q = problem.q, inside
    with pytest.raises(ValueError, match=r"^paged_attention: workspace overlaps q: expected a "
                       r"buffer sharing no byte with q, got workspace bytes \[\d+, \d+\) within "
                       r"q's span; allocate the workspace on its own \(splitkv.Workspace\)$"):
        problem.run(workspace)
    problem.q = q
    splitkv.check_counter_region(workspace)
    harness.assert_close(problem.run(workspace, num_splits=2), problem.reference()[0], _DTYPE)
    splitkv.check_counter_region(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_cached_ragged_layout_still_refuses_overlaps(device):
    # As above for ragged calls, whose overlap checks run in the C++ launch of a cached
    # layout: out holding v, and a workspace holding cu_seqlens_kv (an index tensor, which
    # only the workspace check covers), are refused with the full path's messages and
    # nothing runs: the counter region stays zero and v keeps its values.
    harness.require(device)
    problem = harness.make_ragged([5, 3], [20, 9], dtype=_DTYPE, device=device)
    buffer = torch.zeros((24 << 20) + 256, dtype=torch.uint8, device=device)
    skip = -buffer.data_ptr() % 256
    workspace = buffer[skip:skip + (24 << 20)]
    out = torch.empty_like(problem.q)
    problem.run(workspace, out=out)
    assert len(_calls._layouts) == 1
    holder = torch.empty(problem.v.numel() + problem.q.numel(), dtype=_DTYPE, device=device)
    holder[:problem.v.numel()].copy_(problem.v.flatten())
    v, problem.v = problem.v, holder[:problem.v.numel()].view(problem.v.shape)
    out_in_v = holder[problem.v.numel() - 8:problem.v.numel() - 8 + problem.q.numel()]
    v_before = problem.v.clone()
    with pytest.raises(ValueError, match=r"^ragged_attention: out overlaps v: expected a tensor "
                       r"sharing no byte with v, got out bytes \[0, 16\) within v's span; "
                       r"attention is not computed in place$"):
        problem.run(workspace, out=out_in_v.view(problem.q.shape))
    assert torch.equal(problem.v, v_before)
    problem.v = v
    splitkv.check_counter_region(workspace)
    cu_bytes = problem.cu_seqlens_kv.numel() * 4
    inside = workspace[-cu_bytes:].view(torch.int32)
    inside.copy_(problem.cu_seqlens_kv)
    cu, problem.cu_seqlens_kv = problem.cu_seqlens_kv, inside
    with pytest.raises(ValueError, match=r"^ragged_attention: workspace overlaps cu_seqlens_kv: "
                       r"expected a buffer sharing no byte with cu_seqlens_kv, got workspace "
                       r"bytes \[\d+, \d+\) within cu_seqlens_kv's span; allocate the workspace "
                       r"on its own \(splitkv.Workspace\)$"):
        problem.run(workspace, out=out)
    problem.cu_seqlens_kv = cu
    splitkv.check_counter_region(workspace)
    harness.assert_close(problem.run(workspace, out=out), problem.reference()[0], _DTYPE)
    assert len(_calls._layouts) == 1  # the refused calls added no layout


def test_option_types_are_part_of_the_layout():
    # True == 1 and hash(True) == hash(1): a cached window_left=1 must not let
    # window_left=True through (refused: a bool is not an int).
    problem = harness.make_ragged([4], [40], dtype=_DTYPE)
    workspace = harness.shared_workspace("cpu")
    problem.run(workspace, window_left=1)
    with pytest.raises(TypeError, match=r"^ragged_attention: window_left has the wrong type: "
                       r"expected an int, got True$"):
        problem.run(workspace, window_left=True)


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(_calls, "_MAX_LAYOUTS", 2)
    workspace = harness.shared_workspace("cpu")
    for q_len in (1, 2, 3, 4):
        problem = harness.make_ragged([q_len], [20], dtype=_DTYPE, seed=q_len)
        harness.assert_close(problem.run(workspace), problem.reference()[0], _DTYPE)
        assert len(_calls._layouts) <= 2


def _counting_full_path(monkeypatch):
    """Counts calls that took the full path (paged_params / ragged_params)."""
    counts = {"full": 0}
    for name in ("paged_params", "ragged_params"):
        original = getattr(_calls, name)

        def counted(*args, _original=original, **kwargs):
            counts["full"] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(_calls, name, counted)
    return counts


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_and_scale_tensors_take_the_per_call_path(device, monkeypatch):
    # A model's layers share a layout but not their sinks or per-head scales: after the
    # first call, each layer's call is a cached one with its own sinks / scales, bitwise
    # the full path's result for them; out overlapping sinks is still refused.
    harness.require(device)
    counts = _counting_full_path(monkeypatch)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE, device=device)
    ragged = harness.make_ragged([9, 30], [40, 30], group=2, dtype=_DTYPE, device=device)
    g = torch.Generator().manual_seed(21)
    layers = [torch.randn(problem.q.shape[1], generator=g).mul(3).to(device) for _ in range(3)]
    cached = [(problem.run(workspace, sinks=s, return_lse=True),
               ragged.run(workspace, sinks=s, return_lse=True)) for s in layers]
    assert counts["full"] == 2  # one per layout: the first layer's paged and ragged calls
    _calls._layouts.clear()
    for s, got in zip(layers, cached):
        for call, result in ((problem.run, got[0]), (ragged.run, got[1])):
            _calls._layouts.clear()
            full = call(workspace, sinks=s, return_lse=True)
            assert torch.equal(result[0], full[0]) and torch.equal(result[1], full[1])
    assert not torch.equal(cached[0][0][0], cached[1][0][0])  # the sinks did change the rows
    # An out that holds the (cached layout's) sinks is refused with the full path's message.
    problem.run(workspace, sinks=layers[0])
    out = torch.empty(problem.q.numel() + 64, dtype=torch.float32, device=device)
    sinks_in_out = out[:problem.q.shape[1]]
    out_view = out.view(torch.float16)[:problem.q.numel()].view(problem.q.shape)
    with pytest.raises(ValueError, match="out"):
        problem.run(workspace, sinks=sinks_in_out, out=out_view)
    harness.assert_counter_region_zero(workspace)
    # Per-head fp8 scales: each call's own tensor is read.
    q = problem.q.to(torch.bfloat16)
    cache = problem.kv_cache.to(torch.float8_e4m3fn)
    scales = [torch.full((cache.shape[2],), v, device=device) for v in (0.5, 2.0)]
    _calls._layouts.clear()
    counts["full"] = 0
    outs = [splitkv.paged_attention(q, cache, problem.block_tables, problem.seq_lens, workspace,
                                    k_scale=sc, v_scale=sc) for sc in scales]
    assert counts["full"] == 1
    _calls._layouts.clear()
    full = splitkv.paged_attention(q, cache, problem.block_tables, problem.seq_lens, workspace,
                                   k_scale=scales[1], v_scale=scales[1])
    assert torch.equal(outs[1], full) and not torch.equal(outs[0], outs[1])


def _freed(x):
    """x with its storage resized to nothing (as FSDP-style freeing leaves a tensor): same
    shape and strides, data_ptr() 0."""
    x.untyped_storage().resize_(0)
    assert x.data_ptr() == 0
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["seq_lens", "cu_seqlens_q", "block_tables"])
def test_cached_paged_layout_refuses_a_tensor_whose_storage_was_freed(device, which):
    # A cached layout's call reads seq_lens and cu_seqlens_q on the host (CPU backend) before
    # the launcher's null checks: with their storage freed it dereferenced null (a crash) or
    # said "max_q_len ... got -1", an argument the caller never gave.
    harness.require(device)
    problem = harness.make_paged([40, 30], page_size=16, q_lens=[3, 2], dtype=_DTYPE,
                                 device=device)
    workspace = harness.shared_workspace(device)
    options = {} if device == "cpu" else {"max_q_len": 3}
    problem.run(workspace, **options)
    problem.run(workspace, **options)  # the cached layout's path
    setattr(problem, which, _freed(getattr(problem, which).clone()))
    with pytest.raises(ValueError, match=f"^paged_attention: {which} is null: expected a valid "
                                         f"pointer, got null$"):
        problem.run(workspace, **options)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_kv", "sinks"])
def test_cached_ragged_layout_refuses_a_tensor_whose_storage_was_freed(device, which):
    harness.require(device)
    problem = harness.make_ragged([3, 5], [40, 17], group=2, dtype=_DTYPE, device=device)
    workspace = harness.shared_workspace(device)
    sinks = torch.randn(problem.q.shape[1], dtype=torch.float32, device=device)
    options = {"sinks": sinks} if device == "cpu" else {"sinks": sinks, "max_q_len": 5}
    problem.run(workspace, **options)
    problem.run(workspace, **options)
    if which == "sinks":
        options["sinks"] = _freed(sinks.clone())
    else:
        setattr(problem, which, _freed(getattr(problem, which).clone()))
    with pytest.raises(ValueError, match=f"^ragged_attention: {which} is null: expected a valid "
                                         f"pointer, got null$"):
        problem.run(workspace, **options)
    harness.assert_counter_region_zero(workspace)


_reader = pytest.mark.skipif(_calls._read_layouts is None,
                             reason="torch publishes no DLPack exchange table (torch < 2.10)")


def test_layouts_are_read_in_cpp_when_torch_publishes_its_dlpack_table():
    # The table is torch's (2.10 and later); with it the per-call keys must come from C++
    # (tensor_reader.h), the reason the table is read at all.
    published = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert (_calls._read_layouts is not None) == published


@_reader
@pytest.mark.parametrize("device", DEVICES)
def test_layout_key_names_every_tensor_property_the_full_path_checks(device):
    harness.require(device)

    def key(*objects):
        read = _calls._read_layouts((), *objects)
        return None if read is None else read[0]

    x = torch.randn(6, 4, 8, device=device, dtype=_DTYPE)
    # The same layout in other memory (a key never holds addresses or values).
    assert key(x, None) == key(torch.ones(6, 4, 8, device=device, dtype=_DTYPE), None)
    base = key(x, None)
    assert isinstance(base, bytes)
    differs = {
        "dtype": key(x.to(torch.bfloat16), None),
        "fp8": key(x.to(torch.float8_e4m3fn), None),
        "shape": key(x[:5], None),
        "strides": key(torch.randn(4, 6, 8, device=device, dtype=_DTYPE).transpose(0, 1), None),
        "rank": key(x.view(6, 32), None),
        "absent vs present": key(x, x),
        "order": key(None, x),
    }
    if device == "cuda":
        differs["device"] = key(x.cpu(), None)
    for name, other in differs.items():
        assert other is not None and other != base, name
    assert key(torch.zeros(3, dtype=torch.int32, device=device)) is not None
    # Anything the key cannot name sends the call to the Python key (None): a subclass,
    # a negated view, a tensor without storage, a dtype no call takes, a non-tensor.
    refused = {
        "subclass": torch.nn.Parameter(x, requires_grad=False),
        "negated view": torch._neg_view(x),
        "sparse": x.to_sparse(),
        "int64": torch.zeros(3, dtype=torch.int64, device=device),
        "float64": x.double(),
        "bool": torch.zeros(3, dtype=torch.bool, device=device),
        "float8_e5m2": x.to(torch.float8_e5m2),
        "meta": torch.empty(6, 4, 8, device="meta", dtype=_DTYPE),
        "a float": 1.0,
        "a list": [x],
    }
    for name, value in refused.items():
        assert key(x, value) is None, name
    # No Python error is left behind by a refused read.
    assert key(x, None) == base
    # The addresses come with the key: data_ptr() of each tensor (views at an offset and
    # empty tensors included), 0 for None.
    views = [x, x[2:], x[:, 1], x.transpose(0, 1)[3:], x[:0], torch.zeros(5, device=device,
                                                                       dtype=torch.int32)[1:]]
    read = _calls._read_layouts((), *views, None)
    assert read[1:] == tuple(v.data_ptr() for v in views) + (0,)


class _Float(float):
    pass


@_reader
def test_layout_key_names_option_values_by_type_and_value():
    # Option values enter the key by exact type and value: True == 1 == 1.0 in a Python key,
    # yet the full path refuses a bool where it wants an int (and the reverse).
    def key(*options):
        read = _calls._read_layouts(options, None)
        return None if read is None else read[0]

    values = [None, True, False, 0, 1, -1, 2**40, 1.0, 0.5, -0.0, 0.0, "HND", "NHD", ""]
    keys = [key(v) for v in values]
    assert None not in keys and len(set(keys)) == len(values)
    assert key(1, None) != key(None, 1) and key("ab", "c") != key("a", "bc")
    assert key(0.5) == key(0.5) and key("HND") == key("H" + "ND")
    # Values the key cannot name exactly: the Python key decides.
    for value in (2**70, _Float(0.5), [1], (1,), object()):
        assert key(value) is None, value
    assert _calls._read_layouts([1], None) is None  # options must be a tuple


@_reader
@pytest.mark.parametrize("device", DEVICES)
def test_new_tensors_of_a_known_layout_take_the_per_call_path(device, monkeypatch):
    # Each call's tensors are new (a serving step's q, out): the key reads their layouts, so
    # only the first call of each layout takes the full path, and every call's result is
    # bitwise the full path's for its own tensors.
    harness.require(device)
    counts = _counting_full_path(monkeypatch)
    workspace = harness.shared_workspace(device)
    for kv_form in ("5d", "pair"):
        problem = harness.make_paged([40, 17, 64], page_size=16, group=2, dtype=_DTYPE,
                                     device=device, kv_form=kv_form)
        g = torch.Generator().manual_seed(5)
        qs = [torch.randn(problem.q.shape, generator=g).to(device, _DTYPE) for _ in range(3)]
        counts["full"] = 0
        _calls._layouts.clear()
        cached = [splitkv.paged_attention(q, problem.kv_cache, problem.block_tables,
                                          problem.seq_lens, workspace, out=torch.empty_like(q))
                  for q in qs]
        assert counts["full"] == 1, kv_form
        for q, got in zip(qs, cached):
            _calls._layouts.clear()
            full = splitkv.paged_attention(q, problem.kv_cache, problem.block_tables,
                                           problem.seq_lens, workspace)
            assert torch.equal(got, full), kv_form
        # The same tensors as a list instead of a tuple: another key, the same result.
        if kv_form == "pair":
            counts["full"] = 0
            listed = splitkv.paged_attention(qs[0], list(problem.kv_cache), problem.block_tables,
                                             problem.seq_lens, workspace)
            assert counts["full"] == 1 and torch.equal(listed, cached[0])
    ragged = harness.make_ragged([9, 30], [40, 30], group=2, dtype=_DTYPE, device=device)
    counts["full"] = 0
    first = ragged.run(workspace)
    second = splitkv.ragged_attention(ragged.q.clone(), ragged.k.clone(), ragged.v.clone(),
                                      ragged.cu_seqlens_q.clone(), ragged.cu_seqlens_kv.clone(),
                                      workspace)
    assert counts["full"] == 1 and torch.equal(first, second)
    harness.assert_counter_region_zero(workspace)


@_reader
def test_float_scale_types_are_part_of_the_layout():
    # A float scale is the template's value: 2.0 then True (== 1.0 in a hash) must not share
    # a layout; True is refused as it is on the full path.
    problem = harness.make_paged([40], page_size=16, dtype=torch.bfloat16)
    workspace = harness.shared_workspace("cpu")
    cache = problem.kv_cache.to(torch.float8_e4m3fn)
    args = (problem.q, cache, problem.block_tables, problem.seq_lens, workspace)
    one = splitkv.paged_attention(*args, k_scale=1.0, v_scale=1.0)
    two = splitkv.paged_attention(*args, k_scale=2.0, v_scale=1.0)
    assert not torch.equal(one, two)
    _calls._layouts.clear()
    assert torch.equal(two, splitkv.paged_attention(*args, k_scale=2.0, v_scale=1.0))
    splitkv.paged_attention(*args, k_scale=1.0, v_scale=1.0)
    with pytest.raises(TypeError, match="k_scale"):
        splitkv.paged_attention(*args, k_scale=True, v_scale=1.0)


def _paged_freed(name, device):
    """A paged call (kwargs for splitkv.paged_attention) whose tensor `name` has elements but
    no memory; the name the refusal gives it."""
    problem = harness.make_paged([40, 30], page_size=16, q_lens=[3, 2], dtype=torch.bfloat16,
                                 device=device)
    kwargs = {"q": problem.q, "kv_cache": problem.kv_cache, "block_tables": problem.block_tables,
              "seq_lens": problem.seq_lens, "cu_seqlens_q": problem.cu_seqlens_q,
              "max_q_len": 3, "sinks": torch.randn(problem.q.shape[1], device=device)}
    if name in ("kv_offsets", "full_seq_lens"):
        kwargs["kv_offsets"] = torch.zeros(2, dtype=torch.int32, device=device)
        kwargs["full_seq_lens"] = problem.seq_lens.clone()
    if name in ("k_scale", "v_scale"):
        kwargs["kv_cache"] = problem.kv_cache.to(torch.float8_e4m3fn)
        kwargs["k_scale"] = torch.full((problem.kv_cache.shape[2],), 0.5, device=device)
        kwargs["v_scale"] = kwargs["k_scale"].clone()
    kwargs[name] = _freed(kwargs[name].clone())
    return kwargs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kv_cache", "kv_cache[0]", "kv_cache[1]"])
def test_cached_layout_names_a_freed_kv_cache_as_the_full_path_does(device, name):
    # The cached layout's C++ launch named a freed 5-D cache, or a pair's tensor, k_cache or
    # v_cache; the full path names the argument: kv_cache, kv_cache[0] or kv_cache[1].
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([40, 30], page_size=16, q_lens=[3, 2], dtype=_DTYPE,
                                 device=device)
    if name == "kv_cache":
        kv_cache = problem.kv_cache.clone()
    else:
        kv_cache = (problem.kv_cache[:, 0].clone(), problem.kv_cache[:, 1].clone())
    kwargs = {"q": problem.q, "block_tables": problem.block_tables, "seq_lens": problem.seq_lens,
              "cu_seqlens_q": problem.cu_seqlens_q, "max_q_len": 3, "workspace": workspace}
    expected = splitkv.paged_attention(kv_cache=kv_cache, **kwargs)
    assert torch.equal(splitkv.paged_attention(kv_cache=kv_cache, **kwargs), expected)
    assert len(_calls._layouts) > 0
    _freed(kv_cache if name == "kv_cache" else kv_cache[int(name[-2])])
    with pytest.raises(ValueError, match=f"^paged_attention: {re.escape(name)} is null: "
                                         f"expected a valid pointer, got null$"):
        splitkv.paged_attention(kv_cache=kv_cache, **kwargs)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["q", "kv_cache", "block_tables", "seq_lens", "cu_seqlens_q",
                                  "sinks", "kv_offsets", "full_seq_lens", "k_scale", "v_scale"])
def test_full_path_refuses_a_tensor_whose_storage_was_freed(device, name):
    # The launchers read a null address as an absent tensor: a freed sinks or per-head scale
    # tensor made the full path run without it (the no-sinks result, a scale of 1.0), and
    # freed index tensors failed inside torch. Now every path says "is null", by name.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    kwargs = _paged_freed(name, device)
    for _ in range(2):  # cache empty, then (had the first run) the cached layout
        with pytest.raises(ValueError, match=f"^paged_attention: {name} is null: expected a "
                                             f"valid pointer, got null$"):
            splitkv.paged_attention(workspace=workspace, **kwargs)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv", "sinks"])
def test_full_path_refuses_a_ragged_tensor_whose_storage_was_freed(device, name):
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_ragged([3, 5], [40, 17], group=2, dtype=_DTYPE, device=device)
    kwargs = {"q": problem.q, "k": problem.k, "v": problem.v, "cu_seqlens_q": problem.cu_seqlens_q,
              "cu_seqlens_kv": problem.cu_seqlens_kv, "max_q_len": 5,
              "sinks": torch.randn(problem.q.shape[1], device=device)}
    kwargs[name] = _freed(kwargs[name].clone())
    with pytest.raises(ValueError, match=f"^ragged_attention: {name} is null: expected a valid "
                                         f"pointer, got null$"):
        splitkv.ragged_attention(workspace=workspace, **kwargs)
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_new_out_strides_are_the_full_paths(device):
    # A contiguous q whose size-1 dimension has another stride: the cached call's new out had
    # q's strides (empty_like), the full path's the canonical ones; now both the latter.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([37, 5], page_size=16, num_kv_heads=1, dtype=_DTYPE,
                                 device=device)
    q = torch.empty_strided((2, 1, 64), (64, 7, 1), dtype=_DTYPE, device=device)
    q.copy_(problem.q)
    outs = [splitkv.paged_attention(q, problem.kv_cache, problem.block_tables, problem.seq_lens,
                                    workspace) for _ in range(2)]
    assert [o.stride() for o in outs] == [(64, 64, 1)] * 2
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("device", DEVICES)
def test_cached_call_on_a_held_workspace_names_what_the_full_path_names(device):
    # A cached call used to claim the workspace before its overlap checks: with the
    # workspace held by another call and out over q it said "workspace in use", the full
    # path "out overlaps q". Now it gives the held workspace back to the full path.
    harness.require(device)
    from splitkv import workspace as workspace_module
    workspace = harness.shared_workspace(device)
    problem = harness.make_paged([40, 17], page_size=16, dtype=_DTYPE, device=device)
    for _ in range(2):  # the layout of a call with out given is cached
        problem.run(workspace, out=torch.empty_like(problem.q))
    key = workspace_module.busy_key(workspace.tensor)
    workspace_module.acquire("test", key)  # another call holds it
    try:
        for clear in (False, True):  # the cached layout, then the full path
            if clear:
                _calls._layouts.clear()
            with pytest.raises(ValueError, match="^paged_attention: out overlaps q"):
                problem.run(workspace, out=problem.q)
            with pytest.raises(ValueError, match="^paged_attention: workspace in use"):
                problem.run(workspace, out=torch.empty_like(problem.q))
    finally:
        workspace_module.release(key)
    harness.assert_close(problem.run(workspace), problem.reference()[0], _DTYPE)
    harness.assert_counter_region_zero(workspace)


def _first_refusal(call, spoil, cached):
    """The ValueError message of call() after spoil(), with its layout cached first or not."""
    _calls._layouts.clear()
    if cached:
        call()
    spoil()
    with pytest.raises(ValueError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["paged seq_lens and sinks freed", "ragged out and k_scale freed",
                                  "ragged k_scale freed, out q"])
def test_cached_call_names_the_first_of_two_refusals_as_the_full_path_does(device, case):
    # The cached layout's C++ launch named a null tensor itself, in its template's input order
    # (sinks before the index tensors, scales before out and before an overlap), so two
    # refusals at once gave another message than the full path. A null address now sends the
    # call to the full path (found by a helper).
    harness.require(device)
    workspace = harness.shared_workspace(device)
    messages = []
    for cached in (False, True):
        if case.startswith("paged"):
            problem = harness.make_paged([40, 17, 64], page_size=16, dtype=_DTYPE, device=device)
            t = {"seq_lens": problem.seq_lens.clone(),
                 "sinks": torch.randn(problem.q.shape[1], device=device)}

            def call():
                return splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                               t["seq_lens"], workspace, sinks=t["sinks"])

            def spoil():
                _freed(t["seq_lens"]), _freed(t["sinks"])
        else:
            problem = harness.make_ragged([5, 3], [20, 9], dtype=_DTYPE, device=device)
            k8, v8 = problem.k.to(torch.float8_e4m3fn), problem.v.to(torch.float8_e4m3fn)
            t = {"out": torch.empty_like(problem.q), "k_scale": torch.ones(2, device=device)}

            def call():
                return splitkv.ragged_attention(problem.q, k8, v8, problem.cu_seqlens_q,
                                                problem.cu_seqlens_kv, workspace, out=t["out"],
                                                k_scale=t["k_scale"], v_scale=1.0)

            def spoil():
                _freed(t["k_scale"])
                if case.endswith("out q"):
                    t["out"] = problem.q
                else:
                    _freed(t["out"])
        messages.append(_first_refusal(call, spoil, cached))
    expected = {"paged seq_lens and sinks freed": "paged_attention: seq_lens is null",
                "ragged out and k_scale freed": "ragged_attention: out is null",
                "ragged k_scale freed, out q": "ragged_attention: out overlaps q"}[case]
    assert messages[0].startswith(expected) and messages[1] == messages[0]
    harness.assert_counter_region_zero(workspace)


@pytest.mark.parametrize("device", DEVICES)
def test_debug_counter_scans_come_after_the_checks_on_a_cached_layout(device, monkeypatch):
    # SPLITKV_CHECK_WORKSPACE=1: a cached call scanned the counter region before the C++
    # launch's overlap check, so a dirty region and out=q named the region (and reset it)
    # where the full path names the overlap. Such calls now take the full path.
    harness.require(device)
    monkeypatch.setattr(splitkv.workspace, "CHECK_EVERY_CALL", True)
    workspace = splitkv.Workspace(16 << 20, device)
    problem = harness.make_paged([40, 17, 64], page_size=16, dtype=_DTYPE, device=device)

    def call(out):
        return splitkv.paged_attention(problem.q, problem.kv_cache, problem.block_tables,
                                       problem.seq_lens, workspace, out=out)

    def spoil():
        workspace.counter_region().view(torch.int32)[5] = 7

    messages = []
    for cached in (False, True):
        _calls._layouts.clear()
        if cached:
            call(torch.empty_like(problem.q))
        spoil()
        with pytest.raises(ValueError) as caught:
            call(problem.q)
        messages.append(str(caught.value))
        workspace.reset()
    assert messages[0].startswith("paged_attention: out overlaps q") and messages[1] == messages[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["q", "seq_lens", "cu_seqlens_kv"])
def test_a_view_of_freed_storage_is_refused_by_name(device, name):
    # A view at an offset into storage resized to 0 reports its offset in bytes as its
    # data_ptr(), not 0: both paths let it through and read that address (a crash on the
    # CPU; found by a helper). The full path now asks the storage; the cached one takes an
    # address below any mapping for null.
    harness.require(device)
    workspace = harness.shared_workspace(device)
    for cached in (False, True):
        _calls._layouts.clear()
        if name == "cu_seqlens_kv":
            problem = harness.make_ragged([5, 3], [20, 9], dtype=_DTYPE, device=device)
            source = problem.cu_seqlens_kv
        else:
            problem = harness.make_paged([40, 17, 64], page_size=16, dtype=_DTYPE, device=device)
            source = getattr(problem, name)
        base = torch.zeros(source.numel() + 16, dtype=source.dtype, device=device)
        view = base[16:].view(source.shape)
        view.copy_(source)
        tensors = {"q": problem.q, name: view}

        def call():
            if name == "cu_seqlens_kv":
                return splitkv.ragged_attention(tensors["q"], problem.k, problem.v,
                                                problem.cu_seqlens_q, tensors[name], workspace)
            return splitkv.paged_attention(tensors["q"], problem.kv_cache, problem.block_tables,
                                           tensors.get("seq_lens", problem.seq_lens), workspace)

        if cached:
            call()
        base.untyped_storage().resize_(0)
        assert view.data_ptr() != 0
        op = "ragged_attention" if name == "cu_seqlens_kv" else "paged_attention"
        with pytest.raises(ValueError, match=f"^{op}: {name} is null: expected a valid pointer, "
                                             f"got null$"):
            call()
    harness.assert_counter_region_zero(workspace)
