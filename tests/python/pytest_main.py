"""Entry point of every py_test made by splitkv_py_test: runs pytest on its arguments.

Bazel runs the test from a read-only runfiles tree, so pytest's cache is off; when Bazel
asks for a JUnit XML report (XML_OUTPUT_FILE), pytest writes it.
"""

import os
import sys

import pytest


def main(argv):
    args = ["-p", "no:cacheprovider", "-q", "-rs"]
    xml_output = os.environ.get("XML_OUTPUT_FILE")
    if xml_output:
        args.append(f"--junitxml={xml_output}")
    return pytest.main(args + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
