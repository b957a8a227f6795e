"""Repository rule: finds the local CUDA toolkit (CUDA_HOME, else /usr/local/cuda).

Defines @local_cuda//:cuda_runtime (headers + static cudart) and CUDA_NVCC in defs.bzl.
When no toolkit is found the targets still exist but are empty, so a CPU-only machine
can build everything that does not ask for --config=cuda.
"""

def _cuda_configure_impl(ctx):
    cuda_home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = cuda_home + "/bin/nvcc"
    found = ctx.path(nvcc).exists
    if found:
        ctx.symlink(cuda_home + "/include", "include")
        ctx.symlink(cuda_home + "/lib64", "lib64")
    ctx.file("defs.bzl", "CUDA_FOUND = %r\nCUDA_NVCC = %r\nCUDA_HOME = %r\n" % (found, nvcc, cuda_home))
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)

cc_library(
    name = "cuda_runtime",
    srcs = glob(["lib64/libcudart_static.a"]),
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
""")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
