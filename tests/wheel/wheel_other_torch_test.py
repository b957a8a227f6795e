"""The wheel next to another torch: a fresh venv with torch 2.14.1 (not the build's 2.13.0).

Manual (tag `manual`): pip installs torch 2.14.1 from this machine's local package index,
a CUDA build of about 5.5 GB that takes a few minutes to install:

    ./tools/bazel test //tests/wheel:wheel_other_torch_test_cpu

Set SPLITKV_OTHER_TORCH_VENV (with --test_env=SPLITKV_OTHER_TORCH_VENV=/path) to a venv
that already holds that torch to skip its install; the wheel is installed there afresh
each run. Runs installed_check.py with --compile: paged and ragged attention against the
float64 reference, eagerly and through splitkv.ops under torch.compile(fullgraph=True).
"""

import os
import pathlib
import subprocess
import sys
import venv

import wheel_contents_test

OTHER_TORCH = "2.14.1"


def _pip(python, *args):
    command = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
               "--no-cache-dir", *args]
    result = subprocess.run(command, capture_output=True, text=True,
                            env=wheel_contents_test.clean_env())
    assert result.returncode == 0, " ".join(command) + "\n" + result.stdout + result.stderr


def _torch_version(python):
    result = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                            capture_output=True, text=True, env=wheel_contents_test.clean_env())
    return result.stdout.strip() if result.returncode == 0 else None


def test_wheel_runs_next_to_torch_2_14(tmp_path):
    env_dir = pathlib.Path(os.environ.get("SPLITKV_OTHER_TORCH_VENV") or tmp_path / "venv")
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False).create(env_dir)
    if not (_torch_version(python) or "").startswith(OTHER_TORCH):
        _pip(python, "install", f"torch=={OTHER_TORCH}")
    assert _torch_version(python).startswith(OTHER_TORCH)

    wheel = wheel_contents_test._wheel_path()
    # --no-index: torch is already there, the wheel needs nothing else.
    _pip(python, "install", "--no-index", "--force-reinstall", "--no-deps", str(wheel))
    _pip(python, "check")

    runfiles = wheel_contents_test._RUNFILES
    check = subprocess.run(
        [python, str(runfiles / "tests" / "wheel" / "installed_check.py"),
         "--reference", str(runfiles / "python" / "splitkv_reference" / "__init__.py"),
         "--expect_prefix", str(env_dir), "--compile"],
        cwd=tmp_path, capture_output=True, text=True,
        env=wheel_contents_test.clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    print(check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"torch {OTHER_TORCH}" in check.stdout
