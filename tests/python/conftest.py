"""pytest setup for splitkv's Python tests: the `gpu` mark, and `import splitkv` (and
splitkv_reference) outside Bazel.

Under Bazel the py_libraries put the packages on sys.path. Under plain `pytest tests/python`
(after `bazel build //python/splitkv`), the package's sources are python/splitkv and its
built extension lies in bazel-bin/python/splitkv (or in $SPLITKV_EXT_DIR): the extension
is loaded as splitkv._splitkv and the sources are put on sys.path. The float64 reference,
python/splitkv_reference, is found there too (python/ goes last on sys.path when splitkv
came from elsewhere, so that copy of splitkv stays the one imported).
"""

import importlib.util
import os
import pathlib
import sys
import sysconfig

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[2]


def _make_splitkv_importable():
    try:
        import splitkv  # noqa: F401
        return
    except ImportError:
        pass
    ext_dirs = [os.environ.get("SPLITKV_EXT_DIR", ""), str(_REPO / "python" / "splitkv"),
                str(_REPO / "bazel-bin" / "python" / "splitkv")]
    for ext_dir in filter(None, ext_dirs):
        # The extension built for this interpreter (EXT_SUFFIX names the Python version).
        path = os.path.join(ext_dir, "_splitkv" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(path):
            continue
        spec = importlib.util.spec_from_file_location("splitkv._splitkv", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["splitkv._splitkv"] = module
        sys.path.insert(0, str(_REPO / "python"))
        return
    raise ImportError("splitkv is not importable and no extension built for this Python "
                      f"was found in {ext_dirs}; run `./tools/bazel build //python/splitkv` first "
                      "or set SPLITKV_EXT_DIR")


def _make_reference_importable():
    try:
        import splitkv_reference  # noqa: F401
    except ImportError:
        sys.path.append(str(_REPO / "python"))


_make_splitkv_importable()
_make_reference_importable()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and a splitkv built with --config=cuda")


@pytest.fixture(autouse=True)
def _record_marks(request):
    """Tells harness.require which marks the running test carries."""
    import harness  # imported late: it imports splitkv, made importable above

    harness.CURRENT_TEST_MARKS = {mark.name for mark in request.node.iter_markers()}
