"""Build macros shared by splitkv's BUILD files: copts, CUDA objects, the Python extension, tests."""

load("@local_cuda//:defs.bzl", "CUDA_NVCC")
load("@local_python//:defs.bzl", "PYTHON_EXT_SUFFIX")

SPLITKV_COPTS = [
    "-std=c++20",
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
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fno-strict-aliasing",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=sm_80",
    "-lineinfo",
]

def _cuda_objects_impl(ctx):
    if not ctx.attr.enabled:
        return [DefaultInfo(files = depset())]
    # Headers and include paths of the C++ deps travel with the compile action, so a .cu
    # includes "cc/splitkv/..." headers exactly as a .cc file of the same library would.
    contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in contexts])
    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    for c in contexts:
        for path in c.includes.to_list() + c.quote_includes.to_list() + c.system_includes.to_list():
            include_flags.append("-I" + path)
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_objs/%s/%s" % (ctx.label.name, src.basename[:-len(".cu")] + ".o"))
        args = ctx.actions.args()
        args.add_all(SPLITKV_NVCC_FLAGS + ctx.attr.copts + include_flags)
        args.add_all(["-c", src.path, "-o", obj.path])
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc": attr.string(),
        "enabled": attr.bool(),
    },
)

def splitkv_cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, tags = []):
    """Compiles .cu files with the local nvcc (one object each) into a cc_library.

    Links CUDA's static runtime. `deps` are cc_library targets whose headers the .cu files
    include. nvcc runs only under --config=cuda (//tools:cuda_enabled); otherwise the
    objects are empty, so `bazel build //...` needs no CUDA toolkit.
    """
    _cuda_objects(
        name = name + "_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        nvcc = CUDA_NVCC,
        enabled = select({
            "//tools:cuda_enabled": True,
            "//conditions:default": False,
        }),
        tags = tags,
    )
    native.cc_library(
        name = name,
        srcs = select({
            "//tools:cuda_enabled": [":" + name + "_objects"],
            "//conditions:default": [],
        }),
        hdrs = [h for h in hdrs if h.endswith(".h")],
        deps = deps + select({
            "//tools:cuda_enabled": ["@local_cuda//:cuda_runtime"],
            "//conditions:default": [],
        }),
        linkstatic = True,
        alwayslink = True,
        visibility = visibility,
        tags = tags,
    )

def splitkv_py_extension(name, srcs, deps = [], visibility = None):
    """A pybind11 extension module `name` + EXT_SUFFIX, as a py_library's data."""
    so = name + ".so"

    # Only PyInit_<name> is exported: the statically linked C++ core stays private to the
    # module, so two extensions carrying it cannot interpose each other's symbols.
    version_script = name + "_exports.lds"
    native.genrule(
        name = name + "_exports",
        outs = [version_script],
        cmd = "echo '{ global: PyInit_" + name + "; local: *; };' > $@",
    )
    native.cc_binary(
        name = so,
        srcs = srcs,
        copts = SPLITKV_COPTS + ["-fvisibility=hidden"],
        additional_linker_inputs = [":" + version_script],
        linkopts = ["-Wl,--version-script=$(location :" + version_script + ")"],
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

def splitkv_py_test(name, srcs, deps = [], data = [], args = [], size = "medium", tags = [], cpu = True, gpu = True, **kwargs):
    """A pytest file as two py_tests: `<name>_cpu` (-m 'not gpu') and `<name>_gpu` (tag gpu).

    cpu = False or gpu = False drops a variant (a file whose tests all carry, or all lack,
    the gpu mark: pytest fails a run that selects no test).
    """
    variants = []
    if cpu:
        variants.append(("cpu", "not gpu", []))
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
            # No __init__.py files in the runfiles: pytest then imports test helpers from the
            # test's own directory, and the workspace directory (named splitkv) cannot
            # shadow the splitkv package.
            legacy_create_init = False,
            tags = tags + extra_tags,
            **kwargs
        )
