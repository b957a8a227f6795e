"""pytest setup for tests/stress: tests/python's conftest (the `gpu` mark of harness.DEVICES,
and `import splitkv` from a source checkout), loaded from its file."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python",
                     "conftest.py")
_SPEC = importlib.util.spec_from_file_location("tests_python_conftest", _PATH)
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)

pytest_configure = _MODULE.pytest_configure
