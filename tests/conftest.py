import os
import shutil
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# The suite keeps its caches to itself: every result cache (tr-optimize's evaluations, autotune tables)
# and anything else written under $XDG_CACHE_HOME goes to one temporary folder per test session, removed
# at the end; set before any test module is imported so subprocesses inherit it too.
_SESSION_DIR = tempfile.mkdtemp(prefix="tr-model-tests-")
os.environ["TR_MODEL_CACHE_DIR"] = os.path.join(_SESSION_DIR, "evaluations")
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_DIR, "xdg-cache")


def _compile_each_kernel_once():
    """One compilation of each cached numba kernel for the whole run, however many processes run it.

    The xdist workers start on different tests that call the same kernels, and with a cold cache each would
    compile them itself (the same tens of seconds of CPU, two or three times over).  Here a worker takes a
    file lock per kernel (in the numba cache folder, which every worker shares) around numba's compile step:
    the first worker compiles and writes the cache, the others wait and then load it.  The lock is taken
    only for a signature not yet compiled in this process, inside numba's own compiler lock (so threads of one
    process never wait on each other's file lock); kernels call kernels in one direction only, so two workers
    never wait on each other.  Spawned processes (the CLIs, notebook kernels) load whatever is cached."""
    try:
        import fcntl
        from numba.core import dispatcher, sigutils
        from numba.core.caching import NullCache
        from numba.core.compiler_lock import global_compiler_lock
    except Exception:  # no numba or no fcntl: each process compiles for itself, as without this
        return
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"tr-model-numba-{os.getuid()}")
    folder = os.path.join(base, "compile-locks")
    original = dispatcher.Dispatcher.compile
    held = set()  # kernels whose lock this process holds (a kernel typed again inside its own compile)

    def compile(self, sig):
        if isinstance(self._cache, NullCache):
            return original(self, sig)
        with global_compiler_lock:
            try:
                if self.overloads.get(tuple(sigutils.normalize_signature(sig)[0])) is not None:
                    return original(self, sig)
            except Exception:
                pass
            name = f"{self.py_func.__module__}.{self.py_func.__qualname__}".replace(os.sep, "_")
            if name in held:
                return original(self, sig)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, name + ".lock"), "a") as fh:
                locked = False
                for _ in range(6000):  # at most 5 minutes; then compile without waiting (never a deadlock)
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        locked = True
                        break
                    except OSError:
                        time.sleep(0.05)
                held.add(name)
                try:
                    return original(self, sig)
                finally:
                    held.discard(name)
                    if locked:
                        fcntl.flock(fh, fcntl.LOCK_UN)

    dispatcher.Dispatcher.compile = compile


_compile_each_kernel_once()


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def shared_path(*parts: str) -> str:
    """A path under ../shared (the reference data, read in place); skips the test, saying so, when absent."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(f"needs the shared reference data, not present here: {path}")
    return path


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A result cache folder inside this test's tmp_path (also for subprocesses)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TR_MODEL_CACHE_DIR", str(d))
    return d


def tool(name: str) -> list[str]:
    """Command line of a console script installed beside this interpreter (falls back to PATH)."""
    cand = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(cand):
        return [cand]
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"console script {name} is not installed")
    return [found]


@pytest.fixture
def run_tool():
    import subprocess

    def run(name, *args, input=None, cwd=None, timeout=300):
        return subprocess.run(tool(name) + [str(a) for a in args], capture_output=True, text=True,
                              input=input, cwd=cwd, timeout=timeout)
    return run


def _console_scripts() -> dict:
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


@pytest.fixture
def run_inproc():
    """``run_inproc("tr-optimize", *args)``: the console script's ``main(argv)`` called in this process, with the
    exit code (``SystemExit`` included) and what it printed, returned as ``run_tool`` returns them.  The same
    code path without a process start (about a second of imports each); a CLI behaviour that needs a real
    process (the exit status the shell sees, signals, a fresh interpreter) keeps a ``run_tool`` test."""
    return call_inproc


def call_inproc(name, *args):
    """What the ``run_inproc`` fixture returns, as a plain function (for helpers outside a fixture)."""
    import contextlib
    import importlib
    import io
    import subprocess

    module, func = _console_scripts()[name].split(":")
    main = getattr(importlib.import_module(module), func)
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        if isinstance(code, str):  # as the interpreter does with sys.exit("message")
            print(code, file=sys.stderr)
            code = 1
    return subprocess.CompletedProcess([name, *argv], 0 if code is None else code, out.getvalue(), err.getvalue())


def pytest_collection_modifyitems(config, items):
    # Longest first: the tests marked slow start the run, so that on pytest-xdist's workers (README: -n 3
    # --dist worksteal) no long test is left to run alone at the end while the other workers sit idle.  The
    # sort is stable and the same in every worker (xdist requires identical collections).
    items.sort(key=lambda item: "slow" not in item.keywords)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch  # noqa: F401
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)
