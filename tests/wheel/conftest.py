"""pytest setup for the wheel and ops tests: the `gpu` mark (as in tests/python/conftest.py),
and tmp_path under Bazel's TEST_TMPDIR, which Bazel clears: the venvs these tests make
(5.5 GB with torch 2.14.1) must not pile up in /tmp."""

import os


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and a splitkv built with --config=cuda")
    if os.environ.get("TEST_TMPDIR") and config.option.basetemp is None:
        config.option.basetemp = os.path.join(os.environ["TEST_TMPDIR"], "pytest")
