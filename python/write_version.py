"""shoal.__version__ and shoal.__commit__: the project's version
(CMakeLists.txt's `project(shoal VERSION x.y.z)`) and the git commit the
module is built from, named as the binaries' --version names them
(common/version.h): a 12-digit commit, "-dirty" when tracked files differ
from it, "unknown" outside a git checkout, or the SHOAL_COMMIT given to
CMake (or to setup.py in the environment) when set.

    python3 python/write_version.py OUT [COMMIT]   writes OUT (shoal/_version.py)

The build (python/CMakeLists.txt, at each `make build`, COMMIT from CMake's
SHOAL_COMMIT) and setup.py (`pip install .`) both use it, so both name a
build the same way. __version__ is PEP 440 with the commit as its local
part, as setuptools_scm writes it: "0.9.0+g16650859f82d", with ".dirty"
for a dirty tree, and "0.9.0" alone when the commit is unknown; pip's
metadata has the same version. No third-party module: any python3 runs it."""
import os
import re
import subprocess
import sys
from typing import Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def project_version(root: str = ROOT) -> str:
    """x.y.z of `project(shoal VERSION x.y.z ...)` in root/CMakeLists.txt."""
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"^\s*project\(\s*shoal\s+VERSION\s+([0-9][0-9.]*)", f.read(), re.M | re.I)
    if not m:
        raise RuntimeError(f"no `project(shoal VERSION x.y.z)` in {root}/CMakeLists.txt")
    return m.group(1)


def _git(root: str, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(root: str = ROOT) -> Tuple[str, bool]:
    """(12-digit commit, dirty) of the checkout at root; ("unknown", False)
    when root is not the top of a git checkout (or git is missing)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(root):
        return "unknown", False
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    if not commit:
        return "unknown", False
    # Tracked files only (build trees are ignored anyway); no optional
    # locks: another git command may hold the index.
    status = _git(root, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
    return commit, bool(status)


def version(root: str = ROOT, commit: Optional[str] = None) -> Tuple[str, str]:
    """(PEP 440 version, commit): ("0.9.0+g16650859f82d.dirty",
    "16650859f82d-dirty"). A non-empty `commit` names the commit instead
    of git."""
    base = project_version(root)
    if not commit:
        commit, dirty = git_commit(root)
        if dirty:
            commit += "-dirty"
    if commit == "unknown":
        return base, commit
    # A local version label is [a-z0-9] parts separated by dots.
    local = ".".join(p for p in re.split(r"[^a-z0-9]+", commit.lower()) if p)
    if re.fullmatch(r"[0-9a-f]{7,40}(\.dirty)?", local):
        local = "g" + local
    return f"{base}+{local}", commit


def render(version_: str, commit: str) -> str:
    return ('"""Written by python/write_version.py at build time: do not edit."""\n'
            f"__version__ = {version_!r}\n"
            f"__commit__ = {commit!r}\n")


def write(path: str, version_: str, commit: str) -> bool:
    """Writes the module at path unless it already says the same (so a
    build that changed nothing rewrites nothing); True when written."""
    text = render(version_, commit)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def main(argv) -> int:
    if len(argv) not in (2, 3):
        print("usage: write_version.py OUT [COMMIT]", file=sys.stderr)
        return 2
    write(argv[1], *version(commit=argv[2] if len(argv) == 3 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
