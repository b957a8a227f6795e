"""splitkv_wheel: a PEP 427 wheel of a py_library and its extension, for the Python it was built for.

The wheel holds every file the py_library ships under `package_dir` (its sources and the
pybind11 extension, whatever the build made of it: CPU-only, or with the CUDA kernels
under --config=cuda): no hand-kept file list. The tag comes from the interpreter the
extension was built against (@local_python: SPLITKV_PYTHON, else .venv): e.g.
cp311-cp311-linux_x86_64 from EXT_SUFFIX .cpython-311-x86_64-linux-gnu.so.
"""

load("@local_python//:defs.bzl", "PYTHON_EXT_SUFFIX", "PYTHON_VERSION")

# EXT_SUFFIX's multiarch triplet -> the platform tag pip expects on Linux.
_PLATFORMS = {
    "x86_64-linux-gnu": "linux_x86_64",
    "aarch64-linux-gnu": "linux_aarch64",
}

def wheel_tag(ext_suffix = PYTHON_EXT_SUFFIX):
    """python-abi-platform of a CPython extension suffix, e.g. cp311-cp311-linux_x86_64."""
    parts = ext_suffix.split(".")
    fields = parts[1].split("-", 2) if len(parts) == 3 else []
    if len(fields) != 3 or fields[0] != "cpython" or fields[2] not in _PLATFORMS:
        fail("splitkv_wheel: EXT_SUFFIX %r unsupported: expected .cpython-<ver>-<arch>-linux-gnu.so" % ext_suffix)
    abi = "cp" + fields[1]  # keeps a free-threaded "t" or debug "d"
    python = "cp" + "".join([c for c in fields[1].elems() if c.isdigit()])
    return "%s-%s-%s" % (python, abi, _PLATFORMS[fields[2]])

def _files_under(target, package_dir):
    prefix = package_dir + "/"
    root = package_dir.rpartition("/")[0]
    files = {}
    for f in target[DefaultInfo].default_runfiles.files.to_list():
        if f.short_path.startswith(prefix):
            files[f.short_path[len(root) + 1 if root else 0:]] = f
    return files

def _splitkv_wheel_impl(ctx):
    files = _files_under(ctx.attr.package, ctx.attr.package_dir)
    if not [p for p in files if p.endswith(PYTHON_EXT_SUFFIX)]:
        fail("splitkv_wheel: no extension *%s under %s in %s" % (PYTHON_EXT_SUFFIX, ctx.attr.package_dir, ctx.attr.package.label))
    version = ctx.attr.version + ("+" + ctx.attr.local_version if ctx.attr.local_version else "")
    tag = wheel_tag()
    out = ctx.actions.declare_file("%s-%s-%s.whl" % (ctx.attr.distribution, version, tag))

    args = ctx.actions.args()
    args.add("--out", out)
    args.add("--name", ctx.attr.distribution)
    args.add("--version", ctx.attr.version)
    args.add("--local_version", ctx.attr.local_version)
    args.add("--tag", tag)
    args.add("--summary", ctx.attr.summary)
    args.add("--requires_python", "==%s.*" % PYTHON_VERSION)
    args.add_all(ctx.attr.requires_dist, before_each = "--requires_dist")
    args.add_all(ctx.attr.provides_extra, before_each = "--provides_extra")
    args.add_all(ctx.attr.classifiers, before_each = "--classifier")
    args.add("--description_file", ctx.file.description)
    args.add("--version_file", ctx.attr.version_file)
    for path in sorted(files):
        args.add("--file", "%s=%s" % (path, files[path].path))

    # The script runs on the toolchain's interpreter directly: a py_binary's stub would
    # look for `python` on PATH, which build actions do not have.
    runtime = ctx.toolchains["@bazel_tools//tools/python:toolchain_type"].py3_runtime
    ctx.actions.run(
        executable = runtime.interpreter_path,
        arguments = [ctx.file._builder.path, args],
        inputs = list(files.values()) + [ctx.file.description, ctx.file._builder],
        outputs = [out],
        mnemonic = "PyWheel",
        progress_message = "Building wheel %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

splitkv_wheel = rule(
    implementation = _splitkv_wheel_impl,
    doc = "A wheel named <distribution>-<version>[+<local_version>]-<tag>.whl.",
    attrs = {
        "package": attr.label(mandatory = True, doc = "the py_library whose files ship"),
        "package_dir": attr.string(mandatory = True, doc = "e.g. python/splitkv: installs as splitkv/"),
        "distribution": attr.string(mandatory = True),
        "version": attr.string(mandatory = True, doc = "must equal __version__ in version_file"),
        "version_file": attr.string(mandatory = True, doc = "path in the wheel, e.g. splitkv/__init__.py"),
        "local_version": attr.string(doc = "PEP 440 local label: the build flavour"),
        "summary": attr.string(mandatory = True),
        "description": attr.label(allow_single_file = [".md"], mandatory = True),
        "requires_dist": attr.string_list(doc = "PEP 508 requirements; an optional one ends in `; extra == \"<name>\"`"),
        "provides_extra": attr.string_list(doc = "the extras those markers name (pip install <distribution>[<name>])"),
        "classifiers": attr.string_list(),
        "_builder": attr.label(
            default = "//python/wheel:build_wheel.py",
            allow_single_file = True,
        ),
    },
    toolchains = ["@bazel_tools//tools/python:toolchain_type"],
)
