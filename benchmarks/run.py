"""The benchmark runner: runs named suites and writes their rows as JSON, then regenerates RESULTS.md.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/run.py SUITE [SUITE...] [--quick]      # run, write results/<suite>.json, regenerate
    python benchmarks/run.py --list                           # the suites, their topics and titles
    python benchmarks/run.py all --quick                      # every suite

A suite is a file ``benchmarks/suites/<name>.py`` (names starting with ``_`` are helpers, not suites) that
defines ``TITLE`` (str), ``COMMAND`` (str: how to reproduce its table), ``COLUMNS`` (list of str: the row
keys, in table order) and ``run(quick: bool) -> list[dict]``; optionally ``TOPIC`` (one of
``report.TOPICS``) and ``NOTES`` (text printed under the table).  Suites import the installed package and
compute their own side-by-side ratios (the thing measured and its baseline in the same run, medians of
repeats).  The runner adds what every table needs: the machine (cores, memory, CPU model, Python, numpy,
numba and scipy versions, load average at the start), the date, the commit, whether ``--quick`` was given,
and the suite's wall time.  ``results/<suite>.json`` is replaced only when the suite succeeds (written to a
temporary name, then renamed).  Exit codes: 0 every suite ran, 1 a suite failed (the others still run),
2 bad arguments (an unknown suite, a suite without the interface).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from types import ModuleType

from tr_core.cli import Parser, fail, run_cli
from tr_core.fileio import atomic_write

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SUITES_DIR = os.path.join(HERE, "suites")
RESULTS_DIR = os.path.join(HERE, "results")
REPORT = os.path.join(HERE, "RESULTS.md")
SCHEMA_VERSION = 1
PACKAGE = "_benchmark_suites"   # suites are loaded as submodules of this name (so ``from . import _common``)


class SuiteError(ValueError):
    """A suite file that does not follow the interface (its message names the suite and what is wrong)."""


def suite_names(suites_dir: str = SUITES_DIR) -> list[str]:
    """Every suite in ``suites_dir``: the ``*.py`` files whose names do not start with ``_``, sorted."""
    try:
        files = os.listdir(suites_dir)
    except OSError:
        return []
    return sorted(f[:-3] for f in files if f.endswith(".py") and not f.startswith("_"))


def _package(suites_dir: str) -> str:
    """A package for the suites folder (so suites can share helpers by relative import), one per folder."""
    suites_dir = os.path.abspath(suites_dir)
    name = PACKAGE if suites_dir == os.path.abspath(SUITES_DIR) else f"{PACKAGE}_{abs(hash(suites_dir)):x}"
    if name not in sys.modules:
        init = os.path.join(suites_dir, "__init__.py")
        spec = importlib.util.spec_from_file_location(name, init if os.path.exists(init) else None,
                                                      submodule_search_locations=[suites_dir])
        if spec is None:  # no __init__.py: an empty namespace-like package
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [suites_dir]
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[name] = pkg
        if spec.loader is not None:
            spec.loader.exec_module(pkg)
    return name


def load_suite(name: str, suites_dir: str = SUITES_DIR) -> ModuleType:
    """Import ``<suites_dir>/<name>.py`` and check its interface; raises SuiteError naming what is wrong."""
    known = suite_names(suites_dir)
    if name not in known:
        raise SuiteError(f"unknown suite {name!r} (known: {', '.join(known) or 'none'})")
    pkg = _package(suites_dir)
    full = f"{pkg}.{name}"
    if full in sys.modules:
        mod = sys.modules[full]
    else:
        spec = importlib.util.spec_from_file_location(full, os.path.join(suites_dir, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[full]
            raise
    check_interface(name, mod)
    return mod


def check_interface(name: str, mod: ModuleType) -> None:
    for attr in ("TITLE", "COMMAND"):
        if not isinstance(getattr(mod, attr, None), str) or not getattr(mod, attr).strip():
            raise SuiteError(f"suite {name!r}: {attr} must be a non-empty string")
    cols = getattr(mod, "COLUMNS", None)
    if (not isinstance(cols, (list, tuple)) or not cols or not all(isinstance(c, str) and c for c in cols)
            or len(set(cols)) != len(cols)):
        raise SuiteError(f"suite {name!r}: COLUMNS must be a non-empty list of distinct strings")
    if not callable(getattr(mod, "run", None)):
        raise SuiteError(f"suite {name!r}: run(quick) must be a function")
    for attr in ("TOPIC", "NOTES"):
        if hasattr(mod, attr) and not isinstance(getattr(mod, attr), str):
            raise SuiteError(f"suite {name!r}: {attr} must be a string")


def _plain(v):
    """A JSON value for a row cell: numpy scalars and arrays become Python numbers and lists; NaN becomes null."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def check_rows(name: str, columns, rows) -> list[dict]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SuiteError(f"suite {name!r}: run() must return a list of dicts")
    cols = set(columns)
    out = []
    for i, r in enumerate(rows):
        extra = [k for k in r if k not in cols]
        if extra:
            raise SuiteError(f"suite {name!r}: row {i} has keys not in COLUMNS: {', '.join(map(str, extra))}")
        out.append({k: _plain(r[k]) for k in columns if k in r})
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2 ** 20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # noqa: BLE001 - an absent or broken package is reported as absent
        return None


def machine_info() -> dict:
    """The machine a result was measured on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"cores": cores, "logical_cpus": os.cpu_count(), "memory_gb": _memory_gb(), "cpu_model": _cpu_model(),
            "arch": platform.machine(), "os": platform.system(), "python": platform.python_version(),
            "numpy": _version("numpy"), "numba": _version("numba"), "scipy": _version("scipy"),
            "load_average_1_5_15": load}


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def run_suite(name: str, mod: ModuleType, quick: bool) -> dict:
    """Run one suite; the results document (not yet written)."""
    machine = machine_info()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    rows = mod.run(quick)
    wall = time.perf_counter() - t0
    doc = {"schema_version": SCHEMA_VERSION, "suite": name, "title": mod.TITLE, "topic": getattr(mod, "TOPIC", None),
           "command": mod.COMMAND, "quick": bool(quick), "machine": machine, "date": date, "commit": _commit(),
           "wall_s": round(wall, 3), "columns": list(mod.COLUMNS),
           "rows": check_rows(name, mod.COLUMNS, rows)}
    if getattr(mod, "NOTES", None):
        doc["notes"] = mod.NOTES
    return doc


def write_results(doc: dict, results_dir: str) -> str:
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, doc["suite"] + ".json")
    atomic_write(path, lambda f: f.write(json.dumps(doc, indent=1, allow_nan=False) + "\n"), error=OSError,
                 what="results")
    return path


def build_parser() -> Parser:
    p = Parser(prog="benchmarks/run.py", description=__doc__.splitlines()[0])
    p.add_argument("suites", nargs="*", metavar="SUITE", help="suite names (files in the suites folder), or all")
    p.add_argument("--quick", action="store_true", help="the suites' short variants (smaller N, fewer repeats)")
    p.add_argument("--list", action="store_true", help="print the suites and exit")
    p.add_argument("--suites-dir", default=SUITES_DIR, help="where the suite files are (default: %(default)s)")
    p.add_argument("--results-dir", default=RESULTS_DIR, help="where results are written (default: %(default)s)")
    p.add_argument("--report", default=REPORT, help="the tables file regenerated after the run "
                   "(default: %(default)s)")
    p.add_argument("--no-report", action="store_true", help="do not regenerate the tables file")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    known = suite_names(a.suites_dir)
    if a.list:
        for name in known:
            try:
                mod = load_suite(name, a.suites_dir)
                print(f"{name:<16} {getattr(mod, 'TOPIC', '-') or '-':<14} {mod.TITLE}")
            except Exception as e:  # noqa: BLE001 - listed as broken, the rest still listed
                print(f"{name:<16} {'?':<14} (cannot load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        return 0
    if not a.suites:
        fail("name at least one suite (or all); --list shows them")
    names = known if a.suites == ["all"] else list(dict.fromkeys(a.suites))
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"unknown suite {unknown[0]!r} (known: {', '.join(known) or 'none'})")
    mods = {}
    for n in names:  # every suite is loaded and checked before any runs: a typo costs nothing
        try:
            mods[n] = load_suite(n, a.suites_dir)
        except SuiteError as e:
            fail(str(e))
    failed = []
    for n in names:
        print(f"# {n}: {mods[n].TITLE} ({'quick' if a.quick else 'full'})", file=sys.stderr, flush=True)
        try:
            doc = run_suite(n, mods[n], a.quick)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - one failing suite does not stop the others
            traceback.print_exc(file=sys.stderr)
            sys.stderr.write(f"error: suite {n!r} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             "; its results file is unchanged\n")
            failed.append(n)
            continue
        path = write_results(doc, a.results_dir)
        print(f"# {n}: {len(doc['rows'])} rows in {doc['wall_s']:.1f} s -> {os.path.relpath(path)}",
              file=sys.stderr, flush=True)
    if not a.no_report:
        import report  # benchmarks/report.py: this script's folder is on the path when run as a script
        report.write_report(a.results_dir, a.report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
