"""Bad input to ``tr-shadow`` and every ShadowPrefill file reader: one ``error:`` line and exit 2, or a result.

Two parts:

* named cases (``BAD_FILES``): one file per kind of damage that a reader used to
  turn into a traceback, a hang, Python's own message or a silent conversion;
  each runs through ``tr-shadow`` in-process and must give exactly one
  ``error:`` line naming the file (and the field where there is one), exit 2,
  and leave no ``--out`` file behind;
* hypothesis fuzzing per reader and for the command line: random bytes, valid
  documents with one field replaced by a random JSON value of another type,
  truncations (plain and gzip'ed), random argument lists.  The property: exit
  0, or exit 2 with one ``error:`` line; never an exception, a hang (every
  reader refuses devices before opening them) or a partial output file.

The fuzz runs in-process with bounded examples so the file stays fast.
"""

from __future__ import annotations

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_prefill.cli import main
from shadow_prefill.cluster.workload import read_azure_trace
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LatencyModel, load_gpu, load_model_arch, read_profile_points
from shadow_prefill.matrix import load_matrix, load_prices
from shadow_prefill.trace_io import read_session_trace

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

CALL = {"session": "a", "step": 0, "model": "small", "prompt_tokens": 50, "new_input_tokens": 50,
        "output_tokens": 5, "gap_s": 0.0, "append_only": True}
CALL2 = {"session": "a", "step": 1, "model": "large", "prompt_tokens": 80, "new_input_tokens": 25,
         "output_tokens": 5, "gap_s": 1.5, "append_only": True}
QUERY = {"question": "what is two plus two", "scores": {"small": 1.0, "large": 0.0}, "cluster_id": 1}
PRICES = {"small": {"size": "7B", "input_price": 0.1, "output_price": 0.2},
          "large": {"size": "70B", "input_price": 1.0, "output_price": 2.0}}
CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
          "vocab_size": 100, "max_position_embeddings": 4096}
GPU = {"name": "g", "bf16_flop_per_s": 1e15, "hbm_bytes_per_s": 3e12, "hbm_bytes": 80e9}
SAVED = {"schema_version": 1, "kind": "latency_model", "model_kind": "linear", "name": "lm", "tp": 1,
         "params": [1.0] + [0.0] * 15}
POINTS = {"schema_version": 1, "kind": "iteration_points",
          "points": [{"n_decode": b, "decode_context": 100 * b, "time_ms": 5 + 0.1 * b} for b in (1, 2, 4, 8)]}
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{i:02d}.1234567,{100 + 7 * i},{10 + i}\n" for i in range(40))


def _jsonl(*recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


def _write(path, data) -> str:
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)
    return str(path)


def _argv(kind: str, path: str, folder) -> list[str]:
    """A tr-shadow command line that reads ``path`` as a file of ``kind`` and does little else."""
    prices = _write(folder / "prices_ok.json", json.dumps(PRICES))
    return {
        "trace": ["stats", "--trace", path],
        "matrix": ["stats", "--matrix", path, "--prices", prices],
        "prices": ["stats", "--trace", _write(folder / "t_ok.jsonl", _jsonl(CALL, CALL2)), "--prices", path],
        "config": ["latency", "--model", path],
        "gpu_spec": ["latency", "--model", "qwen3-0.6b", "--gpu", path],
        "saved": ["stats", "--synthetic", "--sessions", "3", "--latency", "--model-config", f"small={path}",
                  "--model-config", "large=qwen3-0.6b"],
        "profile": ["latency", "--profile", path],
        # the request trace is read before the simulation starts: a bad one fails fast
        "azure": ["simulate", "--synthetic", "--sessions", "3", "--traffic", path, "--capacity-rps", "5",
                  "--measure-s", "1", "--drain-s", "1", "--warmup-s", "0"],
    }[kind]


def _run(capsys, argv, out=None) -> tuple[int, str, str]:
    rc = main(list(argv) + (["--out", str(out)] if out else []))
    o, e = capsys.readouterr()
    return rc, o, e


def _assert_contract(rc: int, err: str, out_path=None):
    assert rc in (0, 2), (rc, err)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if rc == 2:
        assert len(errors) == 1 and err.rstrip("\n").splitlines()[-1].startswith("error:"), err
        assert "Traceback" not in err
        if out_path is not None:
            assert not os.path.exists(out_path)
    else:
        assert errors == [], err
    if out_path is not None:  # never a temporary file left behind
        assert [f for f in os.listdir(os.path.dirname(out_path)) if f.endswith(".tmp")] == []


# ============================================================================ named cases (each failed before)

HUGE = "9" * 5000                       # an integer literal Python refuses to read (over 4300 digits)
BIG = 10 ** 400                          # an integer no float holds
DEEP = "[" * 50000 + "]" * 50000         # nesting past the recursion limit
GZ_TRACE = gzip.compress(_jsonl(*[{**c, "session": f"s{i}"} for i in range(200) for c in (CALL, CALL2)]).encode())

BAD_FILES = [
    # (reader, file name, contents, text the one error line must hold)
    ("trace", "deep.jsonl", DEEP + "\n", "nested too deeply"),
    ("trace", "huge.jsonl", '{"session": "a", "step": ' + HUGE + "}\n", "too long"),
    ("trace", "big.jsonl", _jsonl({**CALL, "prompt_tokens": BIG, "new_input_tokens": BIG}), "'prompt_tokens'"),
    ("trace", "gapbig.jsonl", _jsonl({**CALL, "gap_s": BIG}), "'gap_s'"),
    ("trace", "score.jsonl", _jsonl({**CALL, "score": BIG}), "'score'"),
    ("trace", "trunc.jsonl.gz", GZ_TRACE[:-20], "truncated .gz"),
    ("trace", "cut.jsonl.gz", GZ_TRACE[:40], "truncated .gz"),
    ("trace", "bad.jsonl.gz", b"\x1f\x8b" + b"\x00" * 30, "compressed"),
    ("matrix", "deep.json", DEEP, "nested too deeply"),
    ("matrix", "huge.json", '[{"question": "q", "scores": {"small": ' + HUGE + ', "large": 0}}]', "too long"),
    ("matrix", "big.json", json.dumps([{**QUERY, "scores": {"small": BIG, "large": 0}}]), "score of 'small'"),
    ("matrix", "trunc.json.gz", gzip.compress(json.dumps([QUERY] * 100).encode())[:-30], "truncated .gz"),
    ("prices", "bigprice.json", json.dumps({**PRICES, "small": {"input_price": BIG, "output_price": 0.2}}),
     "'input_price'"),
    ("prices", "bigsize.json", json.dumps({**PRICES, "small": {**PRICES["small"], "size": [7]}}), "'size'"),
    ("prices", "deep.json", DEEP, "nested too deeply"),
    ("config", "inf.json", json.dumps(CONFIG).replace('"hidden_size": 64', '"hidden_size": 1e400'), "hidden_size"),
    ("config", "nan.json", json.dumps(CONFIG).replace('"hidden_size": 64', '"hidden_size": NaN'), "hidden_size"),
    ("config", "big.json", json.dumps({**CONFIG, "num_hidden_layers": BIG}), "num_hidden_layers"),
    ("config", "window.json", json.dumps(CONFIG).replace('"max_position_embeddings": 4096',
                                                         '"max_position_embeddings": 1e400'), None),
    ("config", "deep.json", DEEP, "nested too deeply"),
    ("gpu_spec", "big.json", json.dumps({**GPU, "bf16_flop_per_s": BIG}), "bf16_flop_per_s"),
    ("gpu_spec", "str.json", json.dumps({**GPU, "hbm_bytes": "80e9"}), "hbm_bytes"),
    ("gpu_spec", "name.json", json.dumps({**GPU, "name": ["g"]}), "'name'"),
    ("saved", "strparams.json", json.dumps({**SAVED, "params": ["1.0"] + [0.0] * 15}), "params[0]"),
    ("saved", "bigparams.json", json.dumps({**SAVED, "params": [BIG] + [0.0] * 15}), "params[0]"),
    ("saved", "fit.json", json.dumps({**SAVED, "fit": [1, 2]}), "'fit'"),
    ("saved", "tp.json", json.dumps({**SAVED, "tp": "2"}), "'tp'"),
    ("saved", "tpfloat.json", json.dumps({**SAVED, "tp": 1.5}), "'tp'"),
    ("profile", "big.json", json.dumps({**POINTS, "points": [{"n_decode": BIG, "time_ms": 1}]}), "n_decode"),
    ("profile", "time.json", json.dumps({**POINTS, "points": [{"n_decode": 1, "time_ms": BIG}]}), "time_ms"),
    ("azure", "long.csv", AZURE + '"' + "x" * 200000 + '",1,2\n', "CSV"),
    ("azure", "big.csv", AZURE + "2023-11-16 18:16:00.0," + "9" * 30 + ",1\n", "ContextTokens"),
    ("azure", "trunc.csv.gz", gzip.compress(AZURE.encode())[:-25], "truncated .gz"),
]

# kinds of damage the readers already refused in one line before: kept as regression cover
COVERED_FILES = [
    ("trace", "str.jsonl", _jsonl({**CALL, "prompt_tokens": "50"}), "got str '50'"),
    ("matrix", "strscore.json", json.dumps([{**QUERY, "scores": {"small": "1", "large": 0}}]), "got str '1'"),
    ("prices", "strprice.json", json.dumps({**PRICES, "small": {"input_price": "0.1", "output_price": 0.2}}),
     "'input_price'"),
    ("trace", "gap.jsonl", _jsonl(CALL).replace('"gap_s": 0.0', '"gap_s": 1e400'), "'gap_s'"),
    ("trace", "bin.jsonl", b"\xff\xfe\x00\x00", "UTF-8"),
    ("matrix", "listq.json", json.dumps([{**QUERY, "question": ["q"]}]), "'question'"),
    ("matrix", "listscores.json", json.dumps([{**QUERY, "scores": [1, 0]}]), "'scores'"),
    ("config", "str.json", json.dumps({**CONFIG, "vocab_size": "100"}), "vocab_size"),
    ("azure", "nul.csv", AZURE.replace("107", "1\x0007"), "integers"),
    ("azure", "digits.csv", AZURE + "2023-11-16 18:16:00.0," + "9" * 5000 + ",1\n", "integers"),
    ("azure", "bin.csv", b"\xff\xfe\x00\x01\x02", "UTF-8"),
]


@pytest.mark.parametrize("kind,name,data,msg", BAD_FILES + COVERED_FILES,
                         ids=[f"{k}-{n}" for k, n, _, _ in BAD_FILES + COVERED_FILES])
def test_bad_file_is_one_error_line(capsys, tmp_path, kind, name, data, msg):
    path = _write(tmp_path / name, data)
    out = tmp_path / "result.json"
    rc, o, err = _run(capsys, _argv(kind, path, tmp_path), out=out if kind != "azure" else None)
    if msg is None:  # an optional field that cannot be read is ignored, not a crash
        assert rc == 0, err
        return
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert path in err and msg in err, err
    assert not out.exists() and o == ""


@pytest.mark.parametrize("kind", ["trace", "matrix", "prices", "config", "gpu_spec", "profile", "azure"])
@pytest.mark.parametrize("target", ["/dev/zero", "folder"])
def test_devices_and_folders_refused_without_reading(capsys, tmp_path, kind, target):
    # /dev/zero used to be read forever (a hang); a folder gave Python's own "[Errno 21]"
    path = str(tmp_path) if target == "folder" else target
    rc, _, err = _run(capsys, _argv(kind, path, tmp_path))
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and path in err, err
    if kind == "config" and target == "folder":  # --model takes a model folder: its config.json is missing
        assert "config.json: no such file" in err, err
    else:
        assert ("is a folder" in err) if target == "folder" else ("not a regular file" in err), err


def test_gzip_inputs_are_read(tmp_path):
    # the compressed form of a valid file reads the same as the plain one
    t = _write(tmp_path / "t.jsonl.gz", gzip.compress(_jsonl(CALL, CALL2).encode()))
    assert read_session_trace(t).n_calls == 2
    m = _write(tmp_path / "q.json.gz", gzip.compress(json.dumps([QUERY] * 3).encode()))
    p = _write(tmp_path / "models.json", json.dumps(PRICES))
    assert load_matrix(m, p).n_queries == 3
    a = _write(tmp_path / "a.csv.gz", gzip.compress(AZURE.encode()))
    assert read_azure_trace(a).n == 40


# ============================================================================ fuzzing

# values of the wrong type or size for some field of every format: what a hand-edited or foreign file holds
NASTY = [None, True, False, 0, -1, 1.5, -0.0, 2 ** 31, 2 ** 63, 10 ** 400, -10 ** 400, 1e308, -1e308, 5e-324,
         "1", "", "1e400", "NaN", "small", [], {}, [1, 2], {"a": 1}, [[[]]]]
JSON_LEAF = st.one_of(st.sampled_from(NASTY), st.integers(min_value=-10 ** 30, max_value=10 ** 30),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
JSON_ANY = st.recursive(JSON_LEAF, lambda c: st.one_of(st.lists(c, max_size=3),
                                                        st.dictionaries(st.text(max_size=5), c, max_size=3)),
                        max_leaves=6)

# a valid document per reader, and the fields one example replaces: (document, paths into it, serialiser)
VALID = {
    "trace": ([CALL, CALL2], [(i, k) for i in (0, 1) for k in list(CALL) + ["task", "score"]],
              lambda d: _jsonl(*d)),
    "matrix": ([QUERY, QUERY], [(0, "question"), (0, "scores"), (0, "cluster_id"), (1, "scores", "small"),
                                (1, "scores", "large")], json.dumps),
    "prices": (PRICES, [("small", k) for k in ("input_price", "output_price", "size")] + [("large",)],
               json.dumps),
    "config": (CONFIG, [(k,) for k in list(CONFIG) + ["num_key_value_heads", "head_dim", "torch_dtype",
                                                      "num_local_experts"]], json.dumps),
    "gpu_spec": (GPU, [(k,) for k in list(GPU) + ["flops_efficiency", "pcie_bytes_per_s"]], json.dumps),
    "saved": (SAVED, [(k,) for k in SAVED] + [("params", 0), ("params", 3), ("fit",), ("kv_bytes_per_token",)],
              json.dumps),
    "profile": (POINTS, [("points",), ("points", 0), ("points", 1, "n_decode"), ("points", 2, "time_ms"),
                         ("kind",), ("schema_version",), ("kv_bytes_per_token",)], json.dumps),
}
EXT = {"trace": ".jsonl", "azure": ".csv"}


def _replace(doc, path, value):
    doc = json.loads(json.dumps(doc))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _fuzz_file(capsys, folder, kind: str, data, name: str | None = None):
    path = _write(folder / (name or ("fuzz" + EXT.get(kind, ".json"))), data)
    out = folder / "out.json"
    if out.exists():
        out.unlink()
    argv = _argv(kind, path, folder)
    rc, _, err = _run(capsys, argv, out=None if kind == "azure" else out)
    _assert_contract(rc, err, None if kind == "azure" else str(out))
    if rc == 2:
        assert path in err or "latency model for" in err or "--" in err, err
    return rc


def _library_readers(folder):
    prices = _write(folder / "prices_ok.json", json.dumps(PRICES))

    def saved(p):
        with open(p) as f:
            return LatencyModel.from_dict(json.load(f), where=p)
    return {"trace": read_session_trace, "matrix": lambda p: load_matrix(p, prices), "prices": load_prices,
            "config": load_model_arch, "gpu_spec": load_gpu, "profile": read_profile_points, "saved": saved,
            "azure": read_azure_trace}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_every_field_with_every_wrong_value(tmp_path, kind):
    # exhaustive and deterministic: each field of a valid document replaced by each value of NASTY; the reader
    # returns a result or raises its one-line error naming the file (before: OverflowError, ValueError, TypeError
    # tracebacks, and strings or floats silently converted)
    doc, paths, dump = VALID[kind]
    read = _library_readers(tmp_path)[kind]
    path = str(tmp_path / ("w" + EXT.get(kind, ".json")))
    for field in paths:
        for value in NASTY:
            _write(path, dump(_replace(doc, field, value)))
            try:
                read(path)
            except ShadowError as e:
                msg = str(e)
                assert path in msg and "\n" not in msg and len(msg) < 400, (field, value, msg)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_fuzz_wrong_types_in_valid_documents(capsys, tmp_path, kind):
    doc, paths, dump = VALID[kind]

    @FUZZ
    @given(path=st.sampled_from(paths), value=JSON_ANY)
    def check(path, value):
        _fuzz_file(capsys, tmp_path, kind, dump(_replace(doc, path, value)))

    check()


@pytest.mark.parametrize("kind", sorted(VALID) + ["azure"])
def test_fuzz_random_bytes_and_truncations(capsys, tmp_path, kind):
    if kind == "azure":
        valid = AZURE.encode()
    else:
        doc, _, dump = VALID[kind]
        valid = dump(doc).encode()

    @FUZZ
    @given(how=st.sampled_from(["bytes", "cut", "gzcut", "flip"]), blob=st.binary(max_size=64),
           at=st.floats(0.0, 1.0))
    def check(how, blob, at):
        if how == "bytes":
            data, name = blob, None
        elif how == "cut":
            data, name = valid[:int(at * len(valid))], None
        elif how == "gzcut":
            z = gzip.compress(valid)
            data, name = z[:int(at * len(z))], "fuzz" + EXT.get(kind, ".json") + ".gz"
        else:  # one byte replaced by random bytes
            i = int(at * (len(valid) - 1))
            data, name = valid[:i] + blob[:3] + valid[i + 1:], None
        rc = _fuzz_file(capsys, tmp_path, kind, data, name)
        if kind == "azure":
            assert rc in (0, 2)

    check()


def test_fuzz_readers_raise_only_their_error(tmp_path):
    # the library readers (not only the CLI) raise ShadowError and nothing else, whatever JSON a file holds
    readers = _library_readers(tmp_path)

    @FUZZ
    @given(kind=st.sampled_from(sorted(readers)), value=JSON_ANY)
    def check(kind, value):
        path = _write(tmp_path / ("r" + EXT.get(kind, ".json")), json.dumps(value) if kind != "azure" else
                      "ContextTokens,GeneratedTokens\n" + json.dumps(value) + ",1\n")
        try:
            readers[kind](path)
        except ShadowError as e:
            assert str(e) and "\n" not in str(e)

    check()


# ============================================================================ the command line

FLAGS = {
    "stats": ["--cache-capacity", "--cached-fraction", "--session-rate", "--replay-tpot-s", "--chunk", "--tp",
              "--session-length", "--tool-tokens", "--output-tokens", "--gap-s", "--summary-tokens",
              "--context-window", "--sessions", "--switch-prob", "--first-input", "--step-input", "--tasks",
              "--seed", "--format", "--name", "--synthetic-models", "--pair"],
    "simulate": ["--instances", "--chunk", "--max-seqs", "--host-gb", "--slo-scale", "--shadow-kv-cap",
                 "--cold-age-s", "--beta", "--margin", "--n-min", "--load", "--capacity-rps", "--session-rate",
                 "--warmup-s", "--measure-s", "--drain-s", "--approach", "--window", "--sim-seed", "--tp",
                 "--format"],
    "compare": ["--approaches", "--windows", "--sim-seeds", "--sweep", "--context-bins", "--workers", "--instances",
                "--load", "--capacity-rps", "--measure-s", "--format"],
}
VALUES = st.one_of(st.sampled_from(["0", "-1", "1", "2.5", "nan", "inf", "-inf", "1e400", "9" * 30, "", "x",
                                    "a=1", "small=0", "small=-3", "fixed:0", "geometric:0.5", "1,2", "3-1", "0-2",
                                    "peak", "noon", "json", "xml", "load", "Oracle", "--", "-", "=", "1e-320"]),
                   st.text(max_size=6))


@FUZZ
@given(cmd=st.sampled_from(sorted(FLAGS)), picks=st.lists(st.tuples(st.integers(0, 30), VALUES), max_size=4))
def test_fuzz_command_line_parses_or_refuses(capsys, cmd, picks):
    # argument parsing only (no simulation): every argument list parses, or is refused in one error line
    from shadow_prefill.cli import build_parser
    argv = [cmd, "--synthetic"]
    for i, v in picks:
        argv += [FLAGS[cmd][i % len(FLAGS[cmd])], v]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        err = capsys.readouterr().err
        assert [ln for ln in err.splitlines() if not ln.startswith("note:")] == [err.splitlines()[-1]]
        assert err.splitlines()[-1].startswith("error: "), err
    else:
        err = capsys.readouterr().err
        assert all(ln.startswith("note: ") for ln in err.splitlines()), err


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(picks=st.lists(st.tuples(st.integers(0, 30), VALUES), max_size=3))
def test_fuzz_stats_runs_or_refuses(capsys, tmp_path, picks):
    # the whole command, with its output file: a result, or one error line and no file
    flags = [f for f in FLAGS["stats"] if f not in ("--sessions", "--tasks")]  # sizes of the run stay small
    argv = ["stats", "--synthetic", "--sessions", "4"]
    for i, v in picks:
        argv += [flags[i % len(flags)], v]
    out = tmp_path / "out.csv"
    if out.exists():
        out.unlink()
    rc, o, err = _run(capsys, argv, out=out)
    _assert_contract(rc, err, str(out))
    if rc == 0:
        assert out.exists() and o == ""
