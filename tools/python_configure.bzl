"""Repository rule: finds the Python interpreter, its headers and pybind11's headers.

The interpreter is chosen by SPLITKV_PYTHON (e.g. --repo_env=SPLITKV_PYTHON=/path/to/python3.12
to build the extension for the GPU machine's Python); by default it is the repository's
.venv/bin/python that tools/bazel creates. pybind11's headers come from that interpreter
when it has pybind11, else from the default venv (the headers do not depend on the Python).
"""

_PROBE = """
import json, sysconfig
info = {"include": sysconfig.get_paths()["include"],
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "version": sysconfig.get_python_version()}
try:
    import pybind11
    info["pybind11_include"] = pybind11.get_include()
except ImportError:
    info["pybind11_include"] = ""
print(json.dumps(info))
"""

def _probe(ctx, python):
    result = ctx.execute([python, "-c", _PROBE])
    if result.return_code != 0:
        fail("python_configure: %s failed: %s" % (python, result.stderr))
    return json.decode(result.stdout.strip())

def _python_configure_impl(ctx):
    workspace_root = str(ctx.path(ctx.attr._workspace_marker).dirname)
    default_python = workspace_root + "/.venv/bin/python"
    python = ctx.os.environ.get("SPLITKV_PYTHON", default_python)
    if not ctx.path(python).exists:
        fail("python_configure: interpreter %s not found; run ./tools/bazel (it creates .venv) " % python +
             "or set --repo_env=SPLITKV_PYTHON=/path/to/python")
    info = _probe(ctx, python)
    pybind11_include = info["pybind11_include"]
    if not pybind11_include and python != default_python:
        # The headers do not depend on the Python: .venv's will do, if there is one (without
        # this check the probe below fails with a bare execvp error naming .venv).
        if not ctx.path(default_python).exists:
            fail("python_configure: pybind11 is not installed for SPLITKV_PYTHON=%s " % python +
                 "and there is no .venv to take its headers from; pip install pybind11 for " +
                 "that Python, or run ./tools/bazel once (it creates .venv)")
        pybind11_include = _probe(ctx, default_python)["pybind11_include"]
    if not pybind11_include:
        fail("python_configure: pybind11 is installed neither for %s nor in .venv" % python)

    ctx.symlink(info["include"], "python_include")
    ctx.symlink(pybind11_include, "pybind11_include")
    ctx.file("defs.bzl", "\n".join([
        "PYTHON_INTERPRETER = %r" % python,
        "PYTHON_EXT_SUFFIX = %r" % info["ext_suffix"],
        "PYTHON_VERSION = %r" % info["version"],
        "",
    ]))
    ctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)

py_runtime(
    name = "python3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(python = python))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = ["SPLITKV_PYTHON"],
    local = True,
    attrs = {"_workspace_marker": attr.label(default = "//:WORKSPACE")},
)
