"""Builds tp._C with the project's CMake and packages it with the tp Python package.

    pip install --no-build-isolation ./python_bindings

The extension must be built against the torch it will be imported with, so the build
uses the torch of the running interpreter (hence --no-build-isolation). CMake builds
in <repo>/build-python (or $TP_PY_BUILD_DIR), reused by later installs; the
"python" install component puts _C and libtp next to the package's .py files.
"""

import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch.utils
        except ImportError:
            raise RuntimeError(
                "tp's Python bindings build against the installed torch, which this build cannot import. "
                "Install torch first, then: pip install --no-build-isolation ./python_bindings"
            ) from None
        build_dir = os.environ.get("TP_PY_BUILD_DIR", os.path.join(ROOT, "build-python"))
        # Where setuptools wants tp/_C...so; the install component writes tp/ under this prefix.
        prefix = os.path.dirname(os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name))))
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DTP_BUILD_PYTHON=ON", "-DTP_BUILD_TESTS=OFF", "-DTP_BUILD_BENCHMARKS=OFF",
            f"-DTP_WITH_CUDA={os.environ.get('TP_WITH_CUDA', 'AUTO')}",
        ]
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            generator = ["-G", "Ninja"] if _has("ninja") else []
            configure[1:1] = generator
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "tp_python", "--parallel",
                               str(os.cpu_count() or 1)])
        subprocess.check_call(["cmake", "--install", build_dir, "--component", "python", "--prefix", prefix])


def _has(program):
    return any(os.access(os.path.join(d, program), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))


setup(ext_modules=[CMakeExtension("tp._C")], cmdclass={"build_ext": CMakeBuild})
