"""Writes splitkv's wheel (PEP 427) from files Bazel built: run by python/wheel/wheel.bzl.

The format is the `wheel` package's: wheel.wheelfile.WheelFile writes each file and, on
close, the RECORD with every file's sha256 and size. This script supplies the contents
and the two metadata files (METADATA, core metadata 2.1; WHEEL). Timestamps are fixed
and modes normalised, so the same inputs give the same bytes.

Only the standard library and `wheel` are imported (argparse, not absl): the script runs
under whichever interpreter builds the extension (SPLITKV_PYTHON), which may be a bare
venv holding just `wheel` and pybind11.
"""

import argparse
import ast
import os
import stat
import sys
import zipfile

try:
    from wheel.wheelfile import WheelFile
except ImportError:
    sys.exit(f"build_wheel: the `wheel` package is missing for {sys.executable}: expected "
             "wheel==0.48.0 (requirements.txt); run `pip install wheel==0.48.0` for it")

# 1980-01-02: zip's epoch plus a day, clear of timezone underflow. WheelFile dates the
# RECORD it writes on close from SOURCE_DATE_EPOCH, set to the same day.
_TIMESTAMP = (1980, 1, 2, 0, 0, 0)
_SOURCE_DATE_EPOCH = "315619200"
_GENERATOR = "splitkv python/wheel/build_wheel.py"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="the .whl to write")
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True, help="public version, e.g. 0.1.0")
    parser.add_argument("--local_version", default="", help="e.g. cpu or cuda")
    parser.add_argument("--tag", required=True, help="python-abi-platform, e.g. cp311-cp311-linux_x86_64")
    parser.add_argument("--summary", required=True)
    parser.add_argument("--requires_python", required=True)
    parser.add_argument("--requires_dist", action="append", default=[])
    parser.add_argument("--provides_extra", action="append", default=[],
                        help="an optional feature's name, used by `extra == \"<name>\"` markers")
    parser.add_argument("--classifier", action="append", default=[])
    parser.add_argument("--description_file", required=True, help="Markdown long description")
    parser.add_argument("--version_file", required=True,
                        help="path in the wheel of the module whose __version__ must match")
    parser.add_argument("--file", action="append", default=[], metavar="PATH_IN_WHEEL=SOURCE")
    return parser.parse_args(argv)


def _module_version(source):
    """The string assigned to __version__ in a Python source file, or None."""
    tree = ast.parse(source)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "__version__"
                and isinstance(node.value, ast.Constant)):
            return node.value.value
    return None


def _metadata(args, version):
    with open(args.description_file, encoding="utf-8") as f:
        description = f.read()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {args.name}",
        f"Version: {version}",
        f"Summary: {args.summary}",
        f"Requires-Python: {args.requires_python}",
    ]
    lines += [f"Classifier: {c}" for c in args.classifier]
    lines += [f"Provides-Extra: {e}" for e in args.provides_extra]
    lines += [f"Requires-Dist: {r}" for r in args.requires_dist]
    lines += ["Description-Content-Type: text/markdown", "", description]
    return "\n".join(lines)


def _wheel_file(tag):
    return "\n".join([
        "Wheel-Version: 1.0",
        f"Generator: {_GENERATOR}",
        # The package holds a compiled extension: it installs to platlib.
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ])


def _entry(path_in_wheel, executable):
    info = zipfile.ZipInfo(path_in_wheel, date_time=_TIMESTAMP)
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def main(argv):
    args = _parse_args(argv)
    files = {}
    for spec in args.file:
        path_in_wheel, _, source = spec.partition("=")
        if not source or path_in_wheel in files:
            sys.exit(f"build_wheel: --file {spec!r}: expected a unique PATH_IN_WHEEL=SOURCE")
        files[path_in_wheel] = source
    if args.version_file not in files:
        sys.exit(f"build_wheel: --version_file {args.version_file} is not among the files")
    with open(files[args.version_file], encoding="utf-8") as f:
        found = _module_version(f.read())
    if found != args.version:
        sys.exit(f"build_wheel: version mismatch: expected __version__ = {args.version!r} "
                 f"(python/BUILD) in {args.version_file}, got {found!r}; make them agree")

    version = args.version + (f"+{args.local_version}" if args.local_version else "")
    dist_info = f"{args.name}-{version}.dist-info"
    expected_name = f"{args.name}-{version}-{args.tag}.whl"
    if os.path.basename(args.out) != expected_name:
        sys.exit(f"build_wheel: --out file name mismatch: expected {expected_name}, "
                 f"got {os.path.basename(args.out)}")

    os.environ["SOURCE_DATE_EPOCH"] = _SOURCE_DATE_EPOCH
    with WheelFile(args.out, "w") as wheel:
        for path_in_wheel in sorted(files):
            with open(files[path_in_wheel], "rb") as f:
                data = f.read()
            executable = path_in_wheel.endswith(".so")
            wheel.writestr(_entry(path_in_wheel, executable), data)
        wheel.writestr(_entry(f"{dist_info}/METADATA", False), _metadata(args, version))
        wheel.writestr(_entry(f"{dist_info}/WHEEL", False), _wheel_file(args.tag))
        top_level = sorted({p.split("/")[0] for p in files})
        wheel.writestr(_entry(f"{dist_info}/top_level.txt", False), "\n".join(top_level) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
