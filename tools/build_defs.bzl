"""Build macros shared by splitkv's BUILD files: copts, CUDA objects, the Python extension, tests."""

load("@local_cuda//:defs.bzl", "CUDA_NVCC")
load("@local_python//:defs.bzl", "PYTHON_EXT_SUFFIX")

SPLITKV_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-fno-strict-aliasing",
]

SPLITKV_TEST_COPTS = SPLITKV_COPTS

# sm_90a (H100/H200: wgmma, setmaxnreg) needs the -gencode form with nvcc 13.0; sm_80 for A100.
SPLITKV_NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xcompiler", "-fPIC",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=sm_80",
    "-lineinfo",
]

def splitkv_cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    """Compiles .cu files with the local nvcc into a cc_library (static cudart linked).

    Each .cu becomes one object through a genrule (nvcc runs inside the sandbox with the
    headers listed in `hdrs` and the headers of `deps` given as `hdrs` too).
    """
    objs = []
    for src in srcs:
        obj = "_" + name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([CUDA_NVCC] + SPLITKV_NVCC_FLAGS + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location " + src + ")",
                "-o $@",
            ]),
            tags = ["no-remote"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        linkstatic = True,
        alwayslink = True,
        visibility = visibility,
    )

def splitkv_py_extension(name, srcs, deps = [], visibility = None):
    """A pybind11 extension module `name` + EXT_SUFFIX, as a py_library's data."""
    so = name + ".so"
    native.cc_binary(
        name = so,
        srcs = srcs,
        copts = SPLITKV_COPTS + ["-fvisibility=hidden"],
        linkshared = True,
        linkstatic = True,
        deps = deps + ["@local_python//:pybind11"],
    )
    native.genrule(
        name = name + "_rename",
        srcs = [":" + so],
        outs = [name + PYTHON_EXT_SUFFIX],
        cmd = "cp $< $@",
    )
    native.py_library(
        name = name,
        data = [":" + name + PYTHON_EXT_SUFFIX],
        visibility = visibility,
    )

def splitkv_py_test(name, srcs, deps = [], data = [], args = [], size = "medium", tags = [], gpu = True, **kwargs):
    """A pytest file as two py_tests: `<name>_cpu` (-m 'not gpu') and `<name>_gpu` (tag gpu)."""
    variants = [("cpu", "not gpu", [])]
    if gpu:
        variants.append(("gpu", "gpu", ["gpu"]))
    for suffix, marker, extra_tags in variants:
        native.py_test(
            name = name + "_" + suffix,
            main = "//tests/python:pytest_main.py",
            srcs = srcs + ["//tests/python:pytest_main.py"],
            args = ["-m", "'" + marker + "'"] + ["$(location %s)" % s for s in srcs] + args,
            deps = deps,
            data = data + srcs,
            size = size,
            python_version = "PY3",
            tags = tags + extra_tags,
            **kwargs
        )
