"""Builds torch_tpu: the C runtime (CMake, runtime/) and the C++ glue
extension ``torch_tpu._C`` linked against it (rpath $ORIGIN/lib)."""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = Path(__file__).resolve().parent
RUNTIME_BUILD = ROOT / "build" / "runtime"
LIB_DIR = ROOT / "torch_tpu" / "lib"
BUILD_INFO = "_build_info.py"
GLUE_CXX_FLAGS = ["-O2", "-fvisibility=hidden", "-Wno-unused-parameter", "-Wno-interference-size"]


def _stale(cache: Path) -> bool:
    """Whether a CMake cache names tools or folders that no longer exist."""
    for line in cache.read_text(errors="replace").splitlines():
        for key in ("CMAKE_MAKE_PROGRAM:", "TPURT_OPENBLAS_DIR:", "TPURT_PYTHON:"):
            if line.startswith(key) and "=" in line:
                value = line.split("=", 1)[1].strip()
                if value and not Path(value).exists():
                    return True
    return False


def build_runtime() -> Path:
    """Configure and build libtpurt.so with CMake; copy it into the package.
    Returns the build folder."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cache = RUNTIME_BUILD / "CMakeCache.txt"
    if cache.exists() and _stale(cache):
        # configured by another build environment (pip's isolated ones are
        # deleted after each build): its ninja / OpenBLAS paths are gone
        cache.unlink()
        shutil.rmtree(RUNTIME_BUILD / "CMakeFiles", ignore_errors=True)
    native = cache.exists() and "TPURT_NATIVE:BOOL=ON" in cache.read_text()  # configured before the level variants
    if not cache.exists() or not (RUNTIME_BUILD / "compile_commands.json").exists() or native:
        # compile_commands.json: the flags the runtime is compiled with (torch_tpu.version.build)
        subprocess.check_call(
            ["cmake", "-S", str(ROOT / "runtime"), "-B", str(RUNTIME_BUILD), "-DCMAKE_BUILD_TYPE=Release",
             f"-DTPURT_PYTHON={sys.executable}", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DTPURT_NATIVE=OFF", *gen]
        )
    subprocess.check_call(["cmake", "--build", str(RUNTIME_BUILD), "--target", "tpurt"])
    for rel in runtime_libraries(RUNTIME_BUILD):
        src, dst = RUNTIME_BUILD / rel, LIB_DIR / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            tmp = dst.with_suffix(".tmp")
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)
    return RUNTIME_BUILD


def runtime_libraries(folder: Path) -> list[str]:
    """The engine's libraries under a folder, relative to it: libtpurt.so
    (baseline x86-64) and its x86-64 level variants in glibc-hwcaps/<level>/
    (runtime/CMakeLists.txt)."""
    return ["libtpurt.so"] + sorted(str(p.relative_to(folder)) for p in folder.glob("glibc-hwcaps/*/libtpurt.so"))


def _runtime_flags(build_dir: Path) -> str:
    """The compiler flags of the runtime's own sources, as CMake ran them
    (without the include folders, the file names and the compiler)."""
    commands = json.loads((build_dir / "compile_commands.json").read_text())
    src_dir = (ROOT / "runtime" / "src").resolve()
    cmd = next(c["command"] for c in commands if Path(c["file"]).resolve().is_relative_to(src_dir)
               and "CMakeFiles/tpurt.dir/" in c["command"])  # the baseline library's
    words, flags = shlex.split(cmd)[1:], []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w in ("-o", "-c", "-MF", "-MT"):
            skip = True
        elif not w.startswith("-I") and w not in ("-MD",):
            flags.append(w)
    return " ".join(flags)


def _compiler_version(cmd: str) -> str:
    try:
        return subprocess.run([cmd, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cmd


def write_build_info(build_dir: Path, dest: Path) -> None:
    """torch_tpu/_build_info.py: how this copy was built (torch_tpu.version.build)."""
    cache = dict(line.split("=", 1) for line in (build_dir / "CMakeCache.txt").read_text().splitlines()
                 if "=" in line and not line.startswith(("#", "//")))
    get = lambda key: next((v for k, v in cache.items() if k.split(":")[0] == key), "")  # noqa: E731
    import torch

    info = {
        "build_type": get("CMAKE_BUILD_TYPE"),
        "native": get("TPURT_NATIVE") == "ON",
        "variants": ["x86-64"] + [Path(rel).parent.name for rel in runtime_libraries(build_dir)[1:]],
        "c_compiler": _compiler_version(get("CMAKE_C_COMPILER")),
        "c_flags": _runtime_flags(build_dir),
        "cxx_flags": " ".join(GLUE_CXX_FLAGS),
        "torch": torch.__version__,
    }
    text = ('"""How this copy of torch_tpu was built (written by setup.py; see torch_tpu.version)."""\n'
            f"BUILD = {info!r}\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists() or dest.read_text() != text:
        dest.write_text(text)


class Build(BuildExtension):
    def run(self) -> None:
        build_dir = build_runtime()
        write_build_info(build_dir, ROOT / "torch_tpu" / BUILD_INFO)
        if not self.inplace:
            # a wheel: build_py copied the package before the runtime existed,
            # so the library goes beside the extension in the build tree too
            dst = Path(self.build_lib) / "torch_tpu" / "lib"
            for rel in runtime_libraries(RUNTIME_BUILD):
                (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(LIB_DIR / rel, dst / rel)
            shutil.copy2(ROOT / "torch_tpu" / BUILD_INFO, dst.parent / BUILD_INFO)
        super().run()


# The Makefile's editable install only registers the package (its entry
# points): the extension is then built once, in place, by build_ext.
REGISTER_ONLY = os.environ.get("TORCH_TPU_REGISTER_ONLY") == "1"

setup(
    ext_modules=[] if REGISTER_ONLY else [
        CppExtension(
            name="torch_tpu._C",
            sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "torch_tpu" / "csrc").glob("*.cpp")),
            # torch's own headers include Kineto's as <IActivityProfiler.h> (kineto_profiler.cpp)
            include_dirs=[str(ROOT / "runtime" / "include"), str(ROOT / "torch_tpu" / "csrc"),
                          str(Path(include_paths()[0]) / "kineto")],
            library_dirs=[str(LIB_DIR)],
            libraries=["tpurt"],
            extra_compile_args={"cxx": GLUE_CXX_FLAGS},
            extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
        )
    ],
    cmdclass={"build_ext": Build.with_options(use_ninja=True)},
)
