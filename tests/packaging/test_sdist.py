"""The sdist that `python -m build` makes (and then builds its wheel from)
holds everything setup.py builds from: every committed file of the C runtime
and of the glue, the packaging metadata, and no build products. Built with
--no-isolation from a copy of the tracked files, so it takes seconds; the
whole path, build isolation and the wheel included, is `make test-wheel`."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import ROOT


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def sdist_members(tmp_path_factory) -> set[str]:
    if importlib.util.find_spec("build") is None:
        pytest.skip("PyPI `build` is not installed: run `make build` (requirements.txt pins it)")
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    # a build product lying in the tree must not reach the sdist
    (src / "torch_tpu" / "lib").mkdir(exist_ok=True)
    (src / "torch_tpu" / "lib" / "libtpurt.so").write_bytes(b"\x7fELF not a real library")
    (src / "torch_tpu" / "_build_info.py").write_text("BUILD = {}\n")
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist)],
                          cwd=src, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (tarball,) = dist.glob("torch_tpu-*.tar.gz")
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
    top = names[0].split("/")[0]
    return {n[len(top) + 1:] for n in names if n.startswith(top + "/")}


def test_sdist_holds_every_source_the_build_needs(sdist_members):
    needed = [p for p in _tracked() if p.startswith(("runtime/", "torch_tpu/"))]
    assert any(p.startswith("runtime/src/") for p in needed) and any(p.endswith(".cpp") for p in needed)
    missing = [p for p in needed if p not in sdist_members]
    assert not missing, f"the sdist lacks {len(missing)} source files, e.g. {missing[:8]}"
    for meta in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "PKG-INFO"):
        assert meta in sdist_members


def test_sdist_holds_no_build_products(sdist_members):
    products = [n for n in sdist_members if n.endswith((".so", ".o", ".pyc")) or n.endswith("_build_info.py")]
    assert not products, products
