"""Builds the C library ahead of time and ships it inside the flashqla package.

`pip install .` runs `make` (the repository's Makefile; with the CUDA sources
when nvcc is found, as `make` itself decides) into a build folder of its own
(make's output is shown with `pip install -v`; without -v a one-line hint goes
to the terminal),
so it never mixes objects with a developer's build/, and copies
libflashqla.so into the package. Nothing is compiled at import time. The
version comes from the file VERSION (pyproject.toml's dynamic version), as the
library's does; the sdist's contents are listed in MANIFEST.in.

Environment:
  FLASHQLA_MAKE_ARGS   extra make arguments, e.g. "CUDA=0" for a CPU-only
                       library (faster to build; CUDA tensors then raise
                       NotImplementedError) or "-j8"
  FLASHQLA_PREBUILT    path of an already built libflashqla.so to ship
                       instead of building one
"""

import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def _hint(line):
    """One line the user sees even when pip hides the build's output (no -v):
    written to the terminal when there is one, else to stdout."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(line + "\n")
            return
    except OSError:
        pass
    print(line, flush=True)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "flashqla", "libflashqla.so")
        prebuilt = os.environ.get("FLASHQLA_PREBUILT")
        if prebuilt:
            lib = os.path.abspath(prebuilt)
        else:
            out = os.path.abspath(os.path.join(self.get_finalized_command("build").build_temp,
                                               "flashqla-make"))
            jobs = str(os.cpu_count() or 2)
            cmd = (["make", "-C", ROOT, f"BUILD={out}", f"-j{jobs}"]
                   + shlex.split(os.environ.get("FLASHQLA_MAKE_ARGS", ""))
                   + [os.path.join(out, "libflashqla.so")])
            _hint("flashqla: compiling libflashqla.so with make (minutes when nvcc is found; "
                  "`pip install -v` shows its progress, FLASHQLA_MAKE_ARGS=CUDA=0 builds CPU-only)")
            print("flashqla: " + " ".join(cmd), flush=True)
            # make's output goes straight to this process's stdout, which pip
            # shows line by line with -v (and hides without it)
            subprocess.check_call(cmd)
            lib = os.path.join(out, "libflashqla.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(lib, target)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: platform-specific."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPyWithLibrary}

try:  # tag the wheel py3-none-<platform>: the library does not use Python's ABI
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
