"""splitkv_static_library: one static archive + an include tree, for C++ builds outside Bazel.

Bazel 4 has no cc_static_library. This rule merges the static archives of a cc_library and
of every cc_library of this repository under it (the core, the CPU backend and, under
--config=cuda, the nvcc objects) into one lib<name>.a with `ar`'s MRI script mode, and
packs a tarball:

    include/cc/splitkv/*.h      the public headers and the headers they include
    lib/lib<name>.a             the merged archive
    lib/pkgconfig/<name>.pc     the compile and link flags (`pkg-config --cflags --libs`)

Libraries from other repositories (CUDA's static runtime) stay out of the archive: the
.pc file names them as link flags, with the toolkit's lib64 directory seen at build time.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "CUDA_HOME")

def _archives(cc_info):
    """This repository's archives under cc_info, and the link flags of everything."""
    archives = []
    external = []
    link_flags = []
    for linker_input in cc_info.linking_context.linker_inputs.to_list():
        for flag in linker_input.user_link_flags:
            if flag not in link_flags:
                link_flags.append(flag)
        ours = linker_input.owner.workspace_name == ""
        for library in linker_input.libraries:
            archive = library.pic_static_library or library.static_library
            if not archive:
                continue
            if ours:
                archives.append(archive)
            else:
                external.append(archive)
    return archives, external, link_flags

def _splitkv_static_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    cc_info = ctx.attr.dep[CcInfo]
    archives, external, link_flags = _archives(cc_info)
    external_flags = []
    for archive in external:
        name = archive.basename
        if not (name.startswith("lib") and name.endswith(".a")):
            fail("splitkv_static_library: cannot name %s as a -l flag" % archive.short_path)
        external_flags.append("-l" + name[len("lib"):-len(".a")])
    if external_flags:
        external_flags = ["-L%s/lib64" % CUDA_HOME] + external_flags

    archive_out = ctx.outputs.archive
    tarball = ctx.outputs.tarball
    headers = cc_info.compilation_context.headers.to_list()

    args = ctx.actions.args()
    args.add("--ar", cc_toolchain.ar_executable)
    args.add("--name", ctx.attr.library_name)
    args.add("--description", ctx.attr.description)
    args.add("--version", ctx.attr.version)
    args.add("--archive_out", archive_out)
    args.add("--tarball_out", tarball)
    args.add_all(archives, before_each = "--archive")
    args.add_all(ctx.attr.public_headers, before_each = "--public_header")
    for header in headers:
        args.add("--header", "%s=%s" % (header.short_path, header.path))
    # --flag=value: argparse would read a separate "-lpthread" as an option of its own.
    args.add_all(ctx.attr.cflags, format_each = "--cflag=%s")
    args.add_all(external_flags + link_flags, format_each = "--link_flag=%s")

    # The script runs on the Python toolchain's interpreter directly: a py_binary's stub
    # would look for `python` on PATH, which build actions do not have.
    runtime = ctx.toolchains["@bazel_tools//tools/python:toolchain_type"].py3_runtime
    ctx.actions.run(
        executable = runtime.interpreter_path,
        arguments = [ctx.file._packager.path, args],
        inputs = depset(
            archives + [ctx.file._packager],
            transitive = [cc_info.compilation_context.headers, cc_toolchain.all_files],
        ),
        outputs = [archive_out, tarball],
        mnemonic = "SplitkvStaticLibrary",
        progress_message = "Packing lib%s.a and %s" % (ctx.attr.library_name, tarball.short_path),
    )
    return [DefaultInfo(
        files = depset([archive_out, tarball]),
        runfiles = ctx.runfiles(files = [archive_out, tarball]),
    )]

splitkv_static_library = rule(
    implementation = _splitkv_static_library_impl,
    attrs = {
        "dep": attr.label(mandatory = True, providers = [CcInfo], doc = "the cc_library to pack"),
        "library_name": attr.string(mandatory = True, doc = "lib<library_name>.a"),
        "description": attr.string(mandatory = True, doc = "the .pc file's Description"),
        "version": attr.string(mandatory = True, doc = "the .pc file's Version"),
        "public_headers": attr.string_list(
            mandatory = True,
            doc = "workspace-relative headers to install; the headers they include come along",
        ),
        "cflags": attr.string_list(doc = "compile flags the .pc file adds to -I"),
        "_packager": attr.label(default = "//cc:package_static.py", allow_single_file = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    # Predeclared, so each has a label: //cc:libsplitkv.a, //cc:splitkv_static.tar.gz.
    outputs = {
        "archive": "lib%{library_name}.a",
        "tarball": "%{name}.tar.gz",
    },
    toolchains = [
        "@bazel_tools//tools/cpp:toolchain_type",
        "@bazel_tools//tools/python:toolchain_type",
    ],
    fragments = ["cpp"],
)
