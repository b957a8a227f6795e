"""The wheel of //python:wheel: PEP 427 layout, RECORD hashes, metadata, tag, and a pip install.

The install goes into a fresh virtual environment that sees the build's torch through a
.pth file (no copy of torch); tests/wheel/installed_check.py then runs paged and ragged
attention there against the float64 reference. The same check against another torch
(2.14.1) is the manual test wheel_torch_2_14_test.
"""

import csv
import email.parser
import glob
import hashlib
import base64
import io
import os
import pathlib
import subprocess
import sys
import sysconfig
import venv

import pytest
import torch
from wheel.wheelfile import WheelFile

import splitkv

_RUNFILES = pathlib.Path(os.environ.get("TEST_SRCDIR", "")) / "splitkv"


def clean_env(**extra):
    """The environment minus PYTHONPATH and friends: Bazel's test stub points them at the
    runfiles, where the source tree's splitkv would shadow the installed one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def _wheel_path():
    found = glob.glob(str(_RUNFILES / "python" / "splitkv-*.whl"))
    assert len(found) == 1, f"expected one wheel in the runfiles, got {found}"
    return pathlib.Path(found[0])


@pytest.fixture(scope="module")
def wheel_path():
    return _wheel_path()


def _flavour():
    return "cuda" if splitkv.cuda_backend_available() else "cpu"


def _expected_tag():
    """cp<XY>-cp<XY>-linux_<arch>: the interpreter running this test built the extension."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    arch = sysconfig.get_platform().split("-", 1)[1].replace("-", "_")
    return f"{python}-{python}-linux_{arch}"


def _dist_info():
    return f"splitkv-{splitkv.__version__}+{_flavour()}.dist-info"


def test_file_name_names_version_flavour_and_tag(wheel_path):
    assert wheel_path.name == f"splitkv-{splitkv.__version__}+{_flavour()}-{_expected_tag()}.whl"


def test_contents_are_the_package_and_its_metadata(wheel_path):
    package_dir = pathlib.Path(splitkv.__file__).parent
    ext = "_splitkv" + sysconfig.get_config_var("EXT_SUFFIX")
    expected = sorted(f"splitkv/{p.relative_to(package_dir)}" for p in package_dir.rglob("*.py"))
    expected += [f"splitkv/{ext}"]
    assert "splitkv/integrations/transformers.py" in expected
    dist_info = _dist_info()
    expected += [f"{dist_info}/{name}" for name in ("METADATA", "RECORD", "WHEEL", "top_level.txt")]
    with WheelFile(wheel_path) as wheel:
        assert sorted(wheel.namelist()) == sorted(expected)
        # The shipped files are the built package's, byte for byte.
        for name in wheel.namelist():
            if name.startswith("splitkv/"):
                assert wheel.read(name) == (package_dir / name.split("/", 1)[1]).read_bytes(), name


def test_record_lists_every_file_with_its_sha256_and_size(wheel_path):
    with WheelFile(wheel_path) as wheel:
        record = wheel.read(f"{_dist_info()}/RECORD").decode()
        rows = list(csv.reader(io.StringIO(record)))
        listed = {row[0]: row for row in rows}
        assert len(listed) == len(rows) and sorted(listed) == sorted(wheel.namelist())
        for name in wheel.namelist():
            path, digest, size = listed[name]
            if name.endswith("/RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = wheel.read(name)  # WheelFile also checks the hash while reading
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), name
            assert int(size) == len(data), name


def test_metadata_names_dependencies_and_python(wheel_path):
    with WheelFile(wheel_path) as wheel:
        metadata = email.parser.Parser().parsestr(wheel.read(f"{_dist_info()}/METADATA").decode())
        wheel_file = email.parser.Parser().parsestr(wheel.read(f"{_dist_info()}/WHEEL").decode())
    assert metadata["Metadata-Version"] == "2.1"
    assert metadata["Name"] == "splitkv"
    assert metadata["Version"] == f"{splitkv.__version__}+{_flavour()}"
    assert metadata.get_all("Requires-Dist") == [
        "torch>=2.4", 'transformers>=5.17,<5.18; extra == "transformers"',
        'psutil; extra == "transformers"']
    assert metadata.get_all("Provides-Extra") == ["transformers"]
    assert metadata["Requires-Python"] == f"=={sys.version_info.major}.{sys.version_info.minor}.*"
    assert "splitkv.paged_attention" in metadata.get_payload()
    assert wheel_file["Wheel-Version"] == "1.0"
    assert wheel_file["Root-Is-Purelib"] == "false"
    assert wheel_file.get_all("Tag") == [_expected_tag()]


def test_pip_installs_it_into_a_fresh_venv_where_attention_runs(wheel_path, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, env=clean_env()).stdout.strip()
    # torch from this build's environment, seen through a .pth: no 1 GB copy.
    torch_site = pathlib.Path(torch.__file__).resolve().parents[1]
    pathlib.Path(site, "outer_torch.pth").write_text(f"{torch_site}\n")

    # --no-index: the Requires-Dist (torch>=2.4) must be met by what the venv sees.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
         "--disable-pip-version-check", "--no-cache-dir", str(wheel_path)],
        capture_output=True, text=True, env=clean_env())
    assert install.returncode == 0, install.stdout + install.stderr
    installed = list(pathlib.Path(site).glob("splitkv-*.dist-info"))
    assert [p.name for p in installed] == [_dist_info()]

    check = subprocess.run(
        [python, str(_RUNFILES / "tests" / "wheel" / "installed_check.py"),
         "--reference", str(_RUNFILES / "python" / "splitkv_reference" / "__init__.py"),
         "--expect_prefix", str(env_dir)],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env())
    print(check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "all checks passed" in check.stdout

    # The optional integration ships and imports from the install (this venv sees the
    # build's transformers through the same .pth as torch).
    code = ("import splitkv.integrations.transformers as m, sys; "
            "print(m.register(), m.__file__.startswith(sys.prefix))")
    integration = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True,
                                 text=True, env=clean_env())
    assert integration.returncode == 0, integration.stdout + integration.stderr
    assert integration.stdout.split() == ["paged|splitkv", "True"]
