"""Packs splitkv's static library: run by splitkv_static_library (cc/static_library.bzl).

Merges the archives into one with `ar -M` (MRI script: addlib keeps every member, even
two of one name), collects the public headers and every project header they include
("cc/..." includes, followed recursively), writes a pkg-config file, and tars the three
into include/, lib/ and lib/pkgconfig/. Timestamps and owners are fixed, so the same
inputs give the same tarball.
"""

import argparse
import gzip
import io
import os
import re
import subprocess
import sys
import tarfile

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ar", required=True)
    parser.add_argument("--name", required=True, help="lib<name>.a, <name>.pc")
    parser.add_argument("--description", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--archive_out", required=True)
    parser.add_argument("--tarball_out", required=True)
    parser.add_argument("--archive", action="append", default=[])
    parser.add_argument("--public_header", action="append", default=[])
    parser.add_argument("--header", action="append", default=[], metavar="INCLUDE_PATH=FILE")
    parser.add_argument("--cflag", action="append", default=[])
    parser.add_argument("--link_flag", action="append", default=[])
    return parser.parse_args(argv)


def merge_archives(ar, archives, out):
    # MRI paths cannot be quoted: refuse what the script would misread.
    for path in archives + [out]:
        if re.search(r"[\s,;()+*]", path):
            sys.exit(f"package_static: archive path {path!r} unsupported by ar -M")
    script = "".join([f"create {out}\n"] + [f"addlib {a}\n" for a in archives] + ["save\nend\n"])
    if os.path.exists(out):
        os.remove(out)
    result = subprocess.run([ar, "-M"], input=script, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"package_static: {ar} -M failed: {result.stdout}{result.stderr}")


def header_closure(roots, headers):
    """The roots and every header they include that is among `headers` (include path ->
    file); a root missing, or an include that names a "cc/" header not there, fails."""
    wanted, pending = set(), list(roots)
    while pending:
        path = pending.pop()
        if path in wanted:
            continue
        if path not in headers:
            sys.exit(f"package_static: header {path} not found among the library's headers")
        wanted.add(path)
        with open(headers[path], encoding="utf-8") as f:
            for included in _INCLUDE.findall(f.read()):
                if included.startswith("cc/"):
                    pending.append(included)
    return sorted(wanted)


def pkg_config(args):
    libs = " ".join(["-L${libdir}", f"-l{args.name}"] + args.link_flag)
    return "\n".join([
        "prefix=${pcfiledir}/../..",
        "includedir=${prefix}/include",
        "libdir=${prefix}/lib",
        "",
        f"Name: {args.name}",
        f"Description: {args.description}",
        f"Version: {args.version}",
        "Cflags: " + " ".join(["-I${includedir}"] + args.cflag),
        f"Libs: {libs}",
        "",
    ])


def _add(tar, name, data, mode):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar, name):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    info.uname = info.gname = "root"
    tar.addfile(info)


def main(argv):
    args = _parse_args(argv)
    headers = dict(spec.split("=", 1) for spec in args.header)
    merge_archives(args.ar, args.archive, args.archive_out)
    members = []
    for path in header_closure(args.public_header, headers):
        with open(headers[path], "rb") as f:
            members.append((f"include/{path}", f.read(), 0o644))
    with open(args.archive_out, "rb") as f:
        members.append((f"lib/lib{args.name}.a", f.read(), 0o644))
    members.append((f"lib/pkgconfig/{args.name}.pc", pkg_config(args).encode(), 0o644))

    directories = set()
    for name, _, _ in members:
        parent = os.path.dirname(name)
        while parent:
            directories.add(parent)
            parent = os.path.dirname(parent)
    with open(args.tarball_out, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for directory in sorted(directories):
                    _add_dir(tar, directory)
                for name, data, mode in sorted(members):
                    _add(tar, name, data, mode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
