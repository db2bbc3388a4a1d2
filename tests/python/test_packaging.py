"""`pip install .` (issue 48, docs/PYTHON.md "Install"): into a fresh venv
with --system-site-packages, offline, reusing this CMake build tree (nothing
compiled again after `make build`: setup.py builds the target _shoal in it),
then `import shoal` from another directory with no PYTHONPATH, its version,
the example in a one-worker run, and `pip uninstall`; a wheel with
`python3 -m build`; the stub of the extension against what it exposes, and
the public API typed and documented; a torch that ships its CMake files
(faked: Debian's does not) is the one a new build tree is configured with."""
import ast
import inspect
import json
import os
import pydoc
import re
import subprocess
import time
import zipfile

from conftest import BIN, ROOT, Proc  # puts the built module on sys.path

import shoal  # noqa: E402
from shoal import _shoal

BUILD = BIN.parent  # the CMake build tree of these tests
VERSION = re.search(r"^project\(shoal VERSION ([0-9.]+)",
                    (ROOT / "CMakeLists.txt").read_text(), re.M).group(1)


def head_commit():
    """The checkout's 12-digit HEAD, or "unknown" (write_version.py's rule)."""
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def plain_env(**extra):
    """The environment a user has: no PYTHONPATH, no pip version check
    (offline), the build tree named for setup.py."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "SHOAL_PYTHONPATH")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               SHOAL_BUILD_DIR=str(BUILD), PYTHONUNBUFFERED="1", **extra)
    return env


def run(argv, cwd, timeout=600, check=True):
    started = time.monotonic()
    out = subprocess.run([str(a) for a in argv], cwd=cwd, env=plain_env(), capture_output=True,
                         text=True, timeout=timeout)
    took = time.monotonic() - started
    if check:
        assert out.returncode == 0, f"{argv}: exit {out.returncode}\n{out.stdout[-6000:]}\n" \
                                    f"{out.stderr[-6000:]}"
    return out, took


def test_pip_installs_into_a_venv_imports_anywhere_and_uninstalls(tmp_path):
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], tmp_path)
    python = venv / "bin" / "python"
    out, took = run([python, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-index",
                     ROOT], tmp_path)
    log = out.stdout + out.stderr  # pip passes the backend's output on stderr
    compiled = len(re.findall(r"Building CXX object", log))
    print(f"pip install with the build tree {BUILD}: {took:.1f} s, {compiled} objects compiled")
    assert f"shoal: reusing the CMake build tree {BUILD}" in log, log[-4000:]
    assert "Successfully installed shoal-" in out.stdout, out.stdout[-4000:]
    # setuptools' scratch files stay in the build tree, not the repository.
    assert not list(ROOT.glob("*.egg-info")) and not (ROOT / "python" / "shoal.egg-info").exists()

    # Imported from elsewhere, with no PYTHONPATH: the venv's copy.
    probe = ("import json, shoal, shoal._shoal as x; "
             "print(json.dumps([shoal.__file__, x.__file__, shoal.__version__, shoal.__commit__]))")
    out, _ = run([python, "-c", probe], tmp_path)
    init, ext, version, commit = json.loads(out.stdout.strip().splitlines()[-1])
    site = str(venv / "lib")
    assert init.startswith(site) and ext.startswith(site), (init, ext)
    package = os.path.dirname(init)
    for name in ("py.typed", "_shoal.pyi", "_version.py", "__main__.py"):
        assert os.path.isfile(os.path.join(package, name)), name
    # The version and the commit the binaries' --version names.
    assert commit.split("-")[0] == head_commit(), (commit, head_commit())
    assert version.split("+")[0] == VERSION, version
    if commit != "unknown":
        assert version.startswith(f"{VERSION}+g{commit.split('-')[0]}"), version
    out, _ = run([python, "-m", "shoal", "--version"], tmp_path)
    assert out.stdout.strip() == f"shoal {VERSION} (commit {commit})", out.stdout
    out, _ = run([python, "-m", "pip", "show", "shoal"], tmp_path)
    assert f"Version: {version}" in out.stdout, out.stdout
    # The extension needs no library of the build tree (they are static).
    needed = subprocess.run(["ldd", ext], capture_output=True, text=True).stdout
    assert str(BUILD) not in needed and "not found" not in needed, needed

    # The example, as a user runs it: one worker, two short rounds.
    coordinator = Proc([BIN / "shoal-coordinator", "--listen=127.0.0.1:0", "--model=module",
                        "--min_participants=1", "--rounds=2", "--local_steps=20"],
                       tmp_path / "coordinator.log")
    try:
        address = coordinator.wait_for(r"listening on ([0-9.]+:[0-9]+)", 60).group(1)
        worker = Proc([python, ROOT / "examples" / "python" / "fashion_mnist.py",
                       f"--coordinator={address}", "--name=venv"], tmp_path / "venv.log",
                      env=plain_env())
        try:
            worker.wait_for(r"done after 2 rounds", 300)
            assert worker.wait(60) == 0, worker.log()
        finally:
            worker.stop()
    finally:
        coordinator.stop()

    out, _ = run([python, "-m", "pip", "uninstall", "-y", "shoal"], tmp_path)
    assert "Successfully uninstalled shoal-" in out.stdout, out.stdout
    out, _ = run([python, "-c", "import shoal"], tmp_path, check=False)
    assert out.returncode != 0 and "No module named 'shoal'" in out.stderr, out.stderr
    left = [p.name for p in (venv / "lib").glob("python3*/site-packages/shoal*")]
    assert not left, left


def test_a_wheel_builds_without_isolation(tmp_path):
    out, took = run(["/usr/bin/python3", "-m", "build", "--wheel", "--no-isolation",
                     "--outdir", tmp_path / "dist", ROOT], tmp_path)
    wheels = list((tmp_path / "dist").glob("shoal-*.whl"))
    print(f"python3 -m build --wheel: {took:.1f} s, {[w.name for w in wheels]}")
    assert len(wheels) == 1, out.stdout[-4000:]
    assert re.fullmatch(rf"shoal-{re.escape(VERSION)}(\+[a-z0-9.]+)?-cp3\d+-cp3\d+-linux_\w+\.whl",
                        wheels[0].name), wheels[0].name
    names = zipfile.ZipFile(wheels[0]).namelist()
    for name in ("shoal/__init__.py", "shoal/__main__.py", "shoal/_version.py",
                 "shoal/_shoal.pyi", "shoal/py.typed"):
        assert name in names, names
    assert any(re.fullmatch(r"shoal/_shoal\.cpython-.*\.so", n) for n in names), names


# ------------------------------------------------------------ types and docs


def _pybind_arity(doc):
    """Arguments in a pybind11 signature line "f(self: X, arg0: List[int]) -> R"."""
    inner = doc.strip().splitlines()[0].split("(", 1)[1].rsplit(") ->", 1)[0]
    if not inner:
        return 0
    depth, count = 0, 1
    for c in inner:
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif c == "," and depth == 0:
            count += 1
    return count


def _stub_arity(fn):
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)


def test_the_stub_names_what_the_extension_exposes():
    stub = ast.parse((ROOT / "python" / "shoal" / "_shoal.pyi").read_text())
    # Names of the stub's own (_Info, _Layer) are not the extension's.
    functions = {n.name: n for n in stub.body
                 if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    classes = {n.name: n for n in stub.body
               if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}
    exposed = {n for n in dir(_shoal) if not n.startswith("_")}
    assert exposed == set(functions) | set(classes), (exposed, set(functions) | set(classes))
    for name, fn in functions.items():
        assert _stub_arity(fn) == _pybind_arity(getattr(_shoal, name).__doc__), name
    methods = {n.name: n for n in classes["Worker"].body if isinstance(n, ast.FunctionDef)}
    native = {n for n in dir(_shoal.Worker) if not n.startswith("_")} | {"__init__"}
    assert native == set(methods), (native, set(methods))
    for name, fn in methods.items():
        doc = getattr(_shoal.Worker, name).__doc__
        assert _stub_arity(fn) == _pybind_arity(doc), f"Worker.{name}: {doc}"
    assert issubclass(_shoal.StatusError, Exception)


def test_the_public_api_is_typed_and_documented():
    public = [getattr(shoal, n) for n in shoal.__all__]
    members = []
    for obj in public:
        assert inspect.getdoc(obj), obj
        if inspect.isclass(obj):
            members += [m for n, m in vars(obj).items()
                        if not n.startswith("_") and (inspect.isfunction(m) or
                                                      isinstance(m, (property, staticmethod)))]
            if "__init__" in vars(obj):
                members.append(vars(obj)["__init__"])
        else:
            members.append(obj)
    for m in members:
        fn = m.fget if isinstance(m, property) else getattr(m, "__func__", m)
        if fn.__name__ != "__init__":
            assert inspect.getdoc(fn), f"{fn.__qualname__} has no docstring"
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, fn.__qualname__
        for p in sig.parameters.values():
            if p.name not in ("self", "cls"):
                assert p.annotation is not inspect.Parameter.empty, f"{fn.__qualname__}({p.name})"
    # help(shoal.Worker) shows the calls and the attributes the loop uses.
    text = pydoc.render_doc(shoal.Worker, renderer=pydoc.plaintext)
    for word in ("step(self, loss:", "-> bool", "Attributes", "rank, shards", "new_round",
                 "close(self, reason: str"):
        assert word in text, word
    assert re.fullmatch(r"[0-9.]+(\+[a-z0-9.]+)?|unknown", shoal.__version__), shoal.__version__


def fake_torch_with_cmake_files(tmp_path):
    """A `torch` package whose torch.utils.cmake_prefix_path holds a
    Torch/TorchConfig.cmake, as a pip or CUDA build of torch ships (Debian's
    does not): the config stops CMake with a message naming itself, so a
    configure that reaches it proves CMake looked there first."""
    site = tmp_path / "site"
    (site / "torch" / "utils").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    prefix = tmp_path / "share" / "cmake"
    (prefix / "Torch").mkdir(parents=True)
    (prefix / "Torch" / "TorchConfig.cmake").write_text(
        'message(FATAL_ERROR "shoal-test: the interpreter\'s Torch at ${CMAKE_CURRENT_LIST_DIR}")\n')
    (site / "torch" / "utils" / "__init__.py").write_text(f"cmake_prefix_path = {str(prefix)!r}\n")
    return site, prefix


def test_a_torch_that_ships_cmake_files_is_the_one_built_against(tmp_path):
    site, prefix = fake_torch_with_cmake_files(tmp_path)
    # A new build tree is configured with that torch's prefix first.
    env = plain_env(PYTHONPATH=str(site))
    env["SHOAL_BUILD_DIR"] = str(tmp_path / "tree")
    out = subprocess.run(["/usr/bin/python3", "setup.py", "build_ext"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-4000:]
    assert f"-DCMAKE_PREFIX_PATH={prefix}" in text, text[-4000:]
    assert f"CMake Error at {prefix / 'Torch' / 'TorchConfig.cmake'}" in text, text[-4000:]
    assert "shoal-test: the interpreter's Torch at" in text, text[-4000:]
    # The tests' tree, built against the system's LibTorch, is not reused for
    # it: setup.py says so and names both.
    env["SHOAL_BUILD_DIR"] = str(BUILD)
    out = subprocess.run(["/usr/bin/python3", "setup.py", "build_ext"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-4000:]
    assert "is built against the Torch at" in text, text[-4000:]
    assert f"but this interpreter's torch is {prefix / 'Torch'}" in text, text[-4000:]
    assert "set SHOAL_BUILD_DIR to a new directory" in text
