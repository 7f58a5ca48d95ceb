"""Builds torch_tpu: the C runtime (CMake, runtime/) and the C++ glue
extension ``torch_tpu._C`` linked against it (rpath $ORIGIN/lib)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent
RUNTIME_BUILD = ROOT / "build" / "runtime"
LIB_DIR = ROOT / "torch_tpu" / "lib"


def _stale(cache: Path) -> bool:
    """Whether a CMake cache names tools or folders that no longer exist."""
    for line in cache.read_text(errors="replace").splitlines():
        for key in ("CMAKE_MAKE_PROGRAM:", "TPURT_OPENBLAS_DIR:", "TPURT_PYTHON:"):
            if line.startswith(key) and "=" in line:
                value = line.split("=", 1)[1].strip()
                if value and not Path(value).exists():
                    return True
    return False


def build_runtime() -> None:
    """Configure and build libtpurt.so with CMake; copy it into the package."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cache = RUNTIME_BUILD / "CMakeCache.txt"
    if cache.exists() and _stale(cache):
        # configured by another build environment (pip's isolated ones are
        # deleted after each build): its ninja / OpenBLAS paths are gone
        cache.unlink()
        shutil.rmtree(RUNTIME_BUILD / "CMakeFiles", ignore_errors=True)
    if not cache.exists():
        subprocess.check_call(
            ["cmake", "-S", str(ROOT / "runtime"), "-B", str(RUNTIME_BUILD), "-DCMAKE_BUILD_TYPE=Release",
             f"-DTPURT_PYTHON={sys.executable}", *gen]
        )
    subprocess.check_call(["cmake", "--build", str(RUNTIME_BUILD), "--target", "tpurt"])
    LIB_DIR.mkdir(exist_ok=True)
    src = RUNTIME_BUILD / "libtpurt.so"
    dst = LIB_DIR / "libtpurt.so"
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        tmp = dst.with_suffix(".tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)


class Build(BuildExtension):
    def run(self) -> None:
        build_runtime()
        if not self.inplace:
            # a wheel: build_py copied the package before the runtime existed,
            # so the library goes beside the extension in the build tree too
            dst = Path(self.build_lib) / "torch_tpu" / "lib"
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(LIB_DIR / "libtpurt.so", dst / "libtpurt.so")
        super().run()


# The Makefile's editable install only registers the package (its entry
# points): the extension is then built once, in place, by build_ext.
REGISTER_ONLY = os.environ.get("TORCH_TPU_REGISTER_ONLY") == "1"

setup(
    ext_modules=[] if REGISTER_ONLY else [
        CppExtension(
            name="torch_tpu._C",
            sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "torch_tpu" / "csrc").glob("*.cpp")),
            include_dirs=[str(ROOT / "runtime" / "include"), str(ROOT / "torch_tpu" / "csrc")],
            library_dirs=[str(LIB_DIR)],
            libraries=["tpurt"],
            extra_compile_args={"cxx": ["-O2", "-fvisibility=hidden", "-Wno-unused-parameter", "-Wno-interference-size"]},
            extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
        )
    ],
    cmdclass={"build_ext": Build.with_options(use_ninja=True)},
)
