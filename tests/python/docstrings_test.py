"""Every public function or class with a Parameters section documents each parameter of its
signature, by name, and no shared-paragraph marker of splitkv/_docs.py is left unfilled."""

import inspect
import re

import pytest

import splitkv


def _documented():
    public = [getattr(splitkv, name) for name in splitkv.__all__]
    public += [getattr(splitkv.distributed, name) for name in dir(splitkv.distributed)
               if not name.startswith("_") and inspect.isfunction(getattr(splitkv.distributed, name))
               and getattr(splitkv.distributed, name).__module__ == "splitkv.distributed"]
    return [x for x in public if callable(x) and "Parameters\n" in (inspect.getdoc(x) or "")]


_PUBLIC = _documented()


def test_the_public_api_has_documented_callables():
    names = {x.__name__ for x in _PUBLIC}
    assert {"paged_attention", "ragged_attention", "merge_states", "Workspace"} <= names, names


@pytest.mark.parametrize("obj", _PUBLIC, ids=lambda x: f"{x.__module__}.{x.__name__}")
def test_every_parameter_is_documented(obj):
    doc = inspect.getdoc(obj)
    assert "@" not in re.sub(r">>> .*", "", doc).replace("@classmethod", ""), "an unfilled marker"
    section = doc.split("Parameters\n", 1)[1]
    documented = set()
    for line in section.splitlines():
        # "name : type", "a, b : type" or "a, b" (numpydoc), unindented
        match = re.match(r"(\w+(?:, \w+)*)(?: :|$)", line)
        if match:
            documented.update(match.group(1).split(", "))
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    params = [p for p in signature.parameters if p not in ("self", "args", "kwargs")]
    missing = [p for p in params if p not in documented]
    assert not missing, f"{obj.__name__}: undocumented parameters {missing}"


def test_shared_paragraphs_appear_in_both_operations():
    for name in ("batch_invariant : bool", "sinks : torch.Tensor", "out : torch.Tensor, optional"):
        assert name in splitkv.paged_attention.__doc__
        assert name in splitkv.ragged_attention.__doc__


@pytest.mark.parametrize("op", ["paged_attention", "ragged_attention"])
def test_plans_take_exactly_their_operations_arguments(op):
    # Their docstrings say so instead of repeating the Parameters section.
    plan = getattr(splitkv, "plan_" + op)
    assert "Takes exactly :func:`" + op + "`'s arguments" in " ".join(plan.__doc__.split())
    assert inspect.signature(plan) == inspect.signature(getattr(splitkv, op))
