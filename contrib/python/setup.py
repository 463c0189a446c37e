"""Builds xfer._core against libxfer: found by pkg-config (an installed xfer), or in a build
tree when XFER_BUILD_DIR (and XFER_SRC_DIR) name one - then the extension's run path points
at the build tree's library, as `make check` uses it.

Nothing is written into the source tree: the generated C, the objects and the metadata go to
a fresh temporary folder for each run (or XFER_CYTHON_BUILD_DIR for the C), so that one run
never reuses what another left."""
import atexit
import os
import shlex
import shutil
import subprocess
import tempfile

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

here = os.path.dirname(os.path.abspath(__file__))
build_dir = os.environ.get("XFER_BUILD_DIR")
if build_dir:
    src_dir = os.environ.get("XFER_SRC_DIR", os.path.join(here, "..", ".."))
    libdir = os.path.join(os.path.abspath(build_dir), "framework", ".libs")
    include_dirs = [os.path.join(src_dir, "framework", "include")]
    library_dirs, runtime_dirs = [libdir], [libdir]
    extra_link = []
else:
    def pkg(*args):
        try:
            out = subprocess.run(["pkg-config", *args, "xfer"], check=True,
                                 capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"xfer not found by pkg-config ({e}); install xfer (make "
                             "install) or set PKG_CONFIG_PATH, or XFER_BUILD_DIR for a "
                             "build tree") from None
        return shlex.split(out)
    cflags, libs = pkg("--cflags"), pkg("--libs")
    include_dirs = [f[2:] for f in cflags if f.startswith("-I")]
    library_dirs = [f[2:] for f in libs if f.startswith("-L")]
    runtime_dirs = list(library_dirs)
    extra_link = [f for f in libs if not f.startswith(("-L", "-l"))]

ext = Extension("xfer._core", [os.path.join("xfer", "_core.pyx")],
                include_dirs=include_dirs, library_dirs=library_dirs, libraries=["xfer"],
                runtime_library_dirs=runtime_dirs, extra_link_args=extra_link)


class cython_build_ext(build_ext):
    """Cythonizes at build time, into the build's temporary folder: the distribution keeps
    naming the .pyx (relative), and the generated C never lands next to it."""

    def finalize_options(self):
        super().finalize_options()
        out = os.environ.get("XFER_CYTHON_BUILD_DIR", os.path.join(self.build_temp, "cython"))
        for e in self.extensions:
            e.sources = cythonize([e], language_level=3, build_dir=out)[0].sources


scratch = tempfile.mkdtemp(prefix="xfer-python-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(ext_modules=[ext], cmdclass={"build_ext": cython_build_ext},
      options={"build": {"build_base": os.path.join(scratch, "build")},
               "egg_info": {"egg_base": scratch}})
