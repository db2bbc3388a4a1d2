"""`pip install --no-build-isolation .` (docs/PYTHON.md, "Install"): the
package python/shoal with its extension _shoal, built by the project's CMake.

The extension is the target _shoal of a CMake build tree, by default the one
`make build` uses (build/), or $SHOAL_BUILD_DIR (absolute, or relative to the
repository). A tree that is already configured is reused as it is: only
what changed since its last build is compiled (nothing, after `make build`),
so installing takes seconds, not the world's build again. A directory that
holds no tree yet is configured first, like `make configure` (with Ninja when
there is one), for this interpreter, and with the interpreter's own Torch
where it ships CMake files (torch.utils.cmake_prefix_path: a pip or CUDA
build of torch); Debian's python3-torch does not (its CMake files are
libtorch-dev's), and CMake then finds the system's LibTorch.

setuptools' own scratch files (build/lib*, bdist*, shoal.egg-info) go under
<build tree>/setuptools, never into the repository. The extension links
only system libraries (the project's libraries are static), so the installed
module does not need the build tree afterwards."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.join(ROOT, os.environ.get("SHOAL_BUILD_DIR") or "build")
SCRATCH = os.path.join(BUILD_DIR, "setuptools")


def _load_write_version():
    spec = importlib.util.spec_from_file_location(
        "shoal_write_version", os.path.join(ROOT, "python", "write_version.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


write_version = _load_write_version()


def cache_value(cache, key):
    m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", cache, re.M)
    return m.group(1) if m else None


def read_cache():
    """The build tree's CMakeCache.txt; None when the tree is not configured."""
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8",
                  errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


# The commit the binaries' --version names (common/version.h): $SHOAL_COMMIT,
# else the tree's -DSHOAL_COMMIT, else git's.
VERSION, COMMIT = write_version.version(
    ROOT, os.environ.get("SHOAL_COMMIT") or cache_value(read_cache() or "", "SHOAL_COMMIT"))


def torch_cmake_prefix():
    """The interpreter's torch's CMake prefix when it ships TorchConfig.cmake
    there; None otherwise (Debian's torch, or no torch)."""
    try:
        import torch.utils  # noqa: PLC0415 - only the build needs it
    except ImportError:
        return None
    prefix = getattr(torch.utils, "cmake_prefix_path", None)
    if prefix and os.path.isfile(os.path.join(prefix, "Torch", "TorchConfig.cmake")):
        return prefix
    return None


class BuildPy(build_py):
    """build_py into a clean package directory: the scratch tree is kept
    between builds, and a file removed from python/shoal must not stay in
    the next wheel."""

    def run(self):
        if not self.editable_mode:
            shutil.rmtree(os.path.join(self.build_lib, "shoal"), ignore_errors=True)
        super().run()


class CMakeBuild(build_ext):
    """Builds the target _shoal in the CMake tree and copies it into the
    package, with shoal/_version.py."""

    def run_cmake(self, *args):
        print("shoal:", " ".join(args), flush=True)
        subprocess.run(list(args), check=True)

    def configure(self, torch_prefix):
        cache = read_cache()
        if cache is not None:
            torch_dir = cache_value(cache, "Torch_DIR")
            wanted = os.path.join(torch_prefix, "Torch") if torch_prefix else None
            if wanted and torch_dir and os.path.realpath(torch_dir) != os.path.realpath(wanted):
                sys.exit(f"shoal: the build tree {BUILD_DIR} is built against the Torch at "
                         f"{torch_dir}, but this interpreter's torch is {wanted}: set "
                         "SHOAL_BUILD_DIR to a new directory to build against it")
            print(f"shoal: reusing the CMake build tree {BUILD_DIR}", flush=True)
            return
        args = ["cmake", "-S", ROOT, "-B", BUILD_DIR, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                f"-DSHOAL_PYTHON_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if torch_prefix:
            args.append(f"-DCMAKE_PREFIX_PATH={torch_prefix}")
        self.run_cmake(*args)

    def build_extension(self, ext):
        self.configure(torch_cmake_prefix())
        self.run_cmake("cmake", "--build", BUILD_DIR, "--target", "_shoal",
                       "--parallel", str(os.cpu_count() or 1))
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(BUILD_DIR, "python", "shoal", "_shoal" + suffix)
        if not os.path.isfile(built):
            there = os.path.join(BUILD_DIR, "python", "shoal")
            found = [n for n in os.listdir(there) if n.startswith("_shoal")] \
                if os.path.isdir(there) else []
            sys.exit(f"shoal: no {built}: the build tree's module is {found or 'missing'}, "
                     f"built for another interpreter than {sys.executable} (its CMake cache's "
                     "SHOAL_PYTHON_EXECUTABLE); set SHOAL_BUILD_DIR to a new directory")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        self.copy_file(built, dest)
        # The version the package's metadata names (setup() below), so that
        # `pip list` and shoal.__version__ agree.
        write_version.write(os.path.join(os.path.dirname(dest), "_version.py"),
                            self.distribution.get_version(), COMMIT)

    def copy_extensions_to_source(self):
        # `pip install -e .`: the extension and its _version.py go next to
        # python/shoal's sources (ignored by git); they are copies, stale
        # after the next `make build` until installed again.
        super().copy_extensions_to_source()
        self.copy_file(os.path.join(self.build_lib, "shoal", "_version.py"),
                       os.path.join(ROOT, "python", "shoal", "_version.py"))

    def get_outputs(self):
        outputs = super().get_outputs()
        return outputs + [os.path.join(os.path.dirname(o), "_version.py") for o in outputs]


os.makedirs(SCRATCH, exist_ok=True)
setup(
    version=VERSION,
    ext_modules=[Extension("shoal._shoal", sources=[])],
    cmdclass={"build_py": BuildPy, "build_ext": CMakeBuild},
    options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}},
)
