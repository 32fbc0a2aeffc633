"""Routing-benchmark matrices, the accuracy-per-cost policy and the session builders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shadow_prefill.builder import (AgentLoopParams, LengthDist, LogNormal, MatrixWorkload, SyntheticParams,
                                    estimate_tokens, make_token_counter, generate_synthetic_sessions)
from shadow_prefill._kernels import grow_contexts
from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.matrix import route_accuracy_per_cost, load_matrix, load_prices, parse_size_b

MODELS = {"tiny": {"size": "1B", "input_price": 0.1, "output_price": 0.1},
          "big": {"size": "70B", "input_price": 1.0, "output_price": 2.0},
          "mid": {"size": "8B", "input_price": 0.1, "output_price": 0.1}}


def write_matrix(tmp_path, queries, models=MODELS, jsonl=False, name="m.json"):
    q = tmp_path / name
    if jsonl:
        q.write_text("".join(json.dumps(x) + "\n" for x in queries))
    else:
        q.write_text(json.dumps(queries, indent=2))
    (tmp_path / "models.json").write_text(json.dumps(models, indent=2))
    return q


def test_accuracy_per_cost_tiny_matrix():
    # columns: cheap ($1), expensive ($10)
    scores = np.array([[1, 1], [0, 1], [1, 0], [0, 0], [0.5, 1.0], [0.05, 1.0]], dtype=float)
    cost = np.array([1.0, 10.0])
    # 1/1 > 1/10 -> cheap; 0 < 0.1 -> expensive; cheap; tie at 0 -> cheaper;
    # 0.5/1 > 1/10 -> cheap; 0.05/1 < 1/10 -> expensive
    assert list(route_accuracy_per_cost(scores, cost)) == [0, 1, 0, 0, 0, 1]
    # equal prices: ties go to the cheaper, then to the first listed
    assert list(route_accuracy_per_cost(np.array([[1, 1], [0, 0], [0, 1]], float), np.array([2.0, 2.0]))) == [0, 0, 1]
    # a free model that scores wins; a free model that does not is worth 0
    assert list(route_accuracy_per_cost(np.array([[0, 1], [1, 0]], float), np.array([1.0, 0.0]))) == [1, 0]
    # per-query costs
    per_q = np.array([[1.0, 10.0], [1.0, 0.5]])
    assert list(route_accuracy_per_cost(np.array([[1, 1], [1, 1]], float), per_q)) == [0, 1]
    with pytest.raises(ShadowError):
        route_accuracy_per_cost(scores, np.array([-1.0, 1.0]))


def test_parse_size():
    assert parse_size_b("7B") == 7.0
    assert parse_size_b("500M") == 0.5
    assert parse_size_b(141) == 141.0
    assert parse_size_b("huge") is None
    assert parse_size_b(None) is None


def queries():
    return [{"question": "a" * 40, "scores": {"tiny": 1.0, "big": 1.0, "mid": 0.0}, "cluster_id": 0},
            {"question": "b" * 41, "scores": {"tiny": 0.0, "big": 1.0, "mid": 1.0}, "cluster_id": 0},
            {"question": "c" * 8, "scores": {"tiny": 0.0, "big": 0.0, "mid": 0.0}, "cluster_id": 1},
            {"question": "d" * 4, "scores": {"tiny": 0.0, "big": 1.0, "mid": 0.0}, "cluster_id": 1}]


@pytest.mark.parametrize("jsonl", [False, True])
def test_load_matrix_and_pairs(tmp_path, jsonl):
    m = load_matrix(write_matrix(tmp_path, queries(), jsonl=jsonl))
    assert m.model_names == ("tiny", "big", "mid")
    assert m.scores.shape == (4, 3)
    assert m.task == ["0", "0", "1", "1"]
    assert m.ordered_pair("big", "tiny") == ("tiny", "big")
    assert m.all_pairs() == [("tiny", "big"), ("tiny", "mid"), ("mid", "big")]
    with pytest.raises(ShadowError, match="not in the matrix"):
        m.ordered_pair("tiny", "nope")
    with pytest.raises(ShadowError, match="two different"):
        m.ordered_pair("tiny", "tiny")


def test_builder_by_hand(tmp_path):
    """Fixed sizes (sigma 0): prompts, new inputs, routes and scores follow the agent loop exactly."""
    m = load_matrix(write_matrix(tmp_path, queries()))
    loop = AgentLoopParams(session_length=LengthDist.parse("fixed:2"), tool_tokens=LogNormal(1000, 0.0),
                           output_tokens=LogNormal(300, 0.0), gap_s=LogNormal(2.0, 0.0, lo=0.0, integer=False))
    w = MatrixWorkload(m, loop, seed=1)
    assert list(w.query_tokens) == [10, 11, 2, 1]  # ceil(chars / 4)
    ss = w.sessions(("tiny", "big"))
    assert ss.n_sessions == 2 and list(ss.lengths) == [2, 2]
    # routes: q0 both right -> tiny (cheaper); q1 only big -> big; q2 none -> tiny; q3 only big -> big
    assert [ss.model_names[i] for i in ss.model] == ["tiny", "big", "tiny", "big"]
    assert list(ss.prompt) == [10, 10 + 300 + 1000 + 11, 2, 2 + 300 + 1000 + 1]
    assert list(ss.new_input) == [10, 1011, 2, 1001]
    assert list(ss.output) == [300] * 4
    assert np.allclose(ss.gap_s, 2.0)
    assert list(ss.score) == [1.0, 1.0, 0.0, 1.0]
    assert ss.task_names[int(ss.task[1])] == "1"
    ss.validate()
    acc = w.accuracy(("tiny", "big"))
    assert acc == {"routed": 0.75, "only:tiny": 0.25, "only:big": 0.75}
    # respect_tasks cuts at the cluster change as well (here it coincides)
    w2 = MatrixWorkload(m, loop, seed=1, respect_tasks=True)
    assert list(w2.offsets) == [0, 2, 4]


def test_builder_compaction_by_hand():
    # one session of 4 calls, window 3000, summary 1000, tool 1000, output 300, query 100
    offsets = np.array([0, 4])
    q = np.full(4, 100, dtype=np.int64)
    tool = np.full(4, 1000, dtype=np.int64)
    out = np.full(4, 300, dtype=np.int64)
    model = np.zeros(4, dtype=np.int64)
    p, n, o, app = grow_contexts(offsets, q, tool, out, model, np.array([3000]), 1000)
    # 0: 100; 1: 100+300+1000+100 = 1500 (+300 = 1800 <= 3000)
    # 2: 1500+300+1100 = 2900 -> +300 > 3000: compact -> summary 1000 + tool 1000 + query 100 = 2100
    # 3: 2100+300+1100 = 3500 > 3000 -> compact again -> 2100
    assert list(p) == [100, 1500, 2100, 2100]
    assert list(n) == [100, 1100, 2100, 2100]
    assert list(app) == [True, True, False, False]
    # the output is cut to half the window, the input to what is left
    p, n, o, app = grow_contexts(np.array([0, 1]), np.array([5000]), np.array([0]), np.array([4000]),
                                 np.array([0]), np.array([3000]), 1000)
    assert (p[0], o[0]) == (1500, 1500)


def test_builder_is_reproducible_and_pair_independent(tmp_path):
    m = load_matrix(write_matrix(tmp_path, queries() * 20))
    w1 = MatrixWorkload(m, seed=7)
    w2 = MatrixWorkload(m, seed=7)
    a, b = w1.sessions(("tiny", "big")), w2.sessions(("tiny", "big"))
    assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.gap_s, b.gap_s)
    c = w1.sessions(("tiny", "mid"))
    # same sessions, different routes; prompts equal (windows equal, so no route-dependent compaction)
    assert np.array_equal(a.offsets, c.offsets) and np.array_equal(a.prompt, c.prompt)
    assert not np.array_equal(a.model, c.model)
    assert not np.array_equal(MatrixWorkload(m, seed=8).gap, w1.gap)


def test_tokenizer_counts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    tok = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tok"
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    count = make_token_counter(str(path))
    assert list(count(["hello world", "hello there big world", ""])) == [2, 4, 1]
    m = load_matrix(write_matrix(tmp_path, [{"question": "hello world hello", "scores": {"tiny": 1, "big": 0}}],
                                 models={k: MODELS[k] for k in ("tiny", "big")}))
    assert list(MatrixWorkload(m, tokenizer=str(path / "tokenizer.json")).query_tokens) == [3]
    assert list(make_token_counter(lambda s: len(s.split()))(["a b c"])) == [3]
    with pytest.raises(ShadowError, match="no tokenizer.json"):
        make_token_counter(str(tmp_path / "missing"))


def test_estimate_tokens():
    assert estimate_tokens("") == 1
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


def test_synthetic_generator():
    sp = SyntheticParams(n_sessions=400, switch_prob=0.3, seed=5, n_tasks=3,
                         loop=AgentLoopParams(session_length=LengthDist.parse("uniform:5-9")))
    ss = generate_synthetic_sessions(sp)
    ss.validate()
    assert ss.n_sessions == 400
    assert set(np.unique(ss.lengths)) <= set(range(5, 10))
    share = ss.is_switch.sum() / (~ss.is_first).sum()
    assert 0.27 < share < 0.33  # switch probability per non-first call
    assert len(ss.task_names) == 3
    again = generate_synthetic_sessions(sp)
    assert np.array_equal(ss.model, again.model) and np.array_equal(ss.prompt, again.prompt)
    three = generate_synthetic_sessions(SyntheticParams(n_sessions=50, models=("a", "b", "c"), switch_prob=1.0, seed=1))
    assert three.is_switch.sum() == (~three.is_first).sum()
    with pytest.raises(ShadowError):
        generate_synthetic_sessions(SyntheticParams(models=("a",)))
    with pytest.raises(ShadowError):
        generate_synthetic_sessions(SyntheticParams(switch_prob=1.5))


@pytest.mark.parametrize("spec, ok", [("fixed:3", True), ("uniform:2-5", True), ("geometric:4.5", True),
                                      ("poisson:3", True), ("fixed:0", False), ("uniform:5-2", False),
                                      ("geometric:0.5", False), ("normal:3", False), ("uniform:3", False)])
def test_length_dist_parse(spec, ok):
    if ok:
        d = LengthDist.parse(spec)
        x = d.draw(np.random.default_rng(0), 2000)
        assert x.min() >= 1
        assert abs(x.mean() - d.mean()) < 0.15 * d.mean()
    else:
        with pytest.raises(ShadowError):
            LengthDist.parse(spec)


def test_matrix_bad_entries_name_their_line(tmp_path):
    qs = queries()
    qs[2] = {"question": "x", "scores": {"tiny": 1.0, "big": "yes", "mid": 0.0}}
    p = write_matrix(tmp_path, qs)
    text = p.read_text()
    line = text[:text.index('"yes"')].count("\n") + 1
    start = text[:text.index('"x"')].rfind("{")
    with pytest.raises(InputFileError, match="score of 'big'") as ei:
        load_matrix(p)
    assert ei.value.line == text[:start].count("\n") + 1 and ei.value.line < line
    qs = queries()
    qs[1] = {"question": "x", "scores": {"tiny": 1.0, "big": 0.0}}
    with pytest.raises(InputFileError, match="missing mid"):
        load_matrix(write_matrix(tmp_path, qs, jsonl=True, name="q.jsonl"))
    (tmp_path / "bad.jsonl").write_text(json.dumps(queries()[0]) + "\n{oops\n")
    with pytest.raises(InputFileError, match=r"bad.jsonl:2: invalid JSON"):
        load_matrix(tmp_path / "bad.jsonl")
    (tmp_path / "trunc.json").write_text(json.dumps(queries())[:-5])
    with pytest.raises(InputFileError, match="invalid JSON|unterminated"):
        load_matrix(tmp_path / "trunc.json")
    (tmp_path / "noq.json").write_text(json.dumps([{"scores": {"tiny": 1, "big": 0}}]))
    with pytest.raises(InputFileError, match="question"):
        load_matrix(tmp_path / "noq.json")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(InputFileError, match="no queries"):
        load_matrix(tmp_path / "empty.json")


def test_prices_errors(tmp_path):
    p = tmp_path / "models.json"
    p.write_text(json.dumps({"a": {"input_price": 0.1, "output_price": 0.1}, "b": {"input_price": -1,
                                                                                  "output_price": 1}}, indent=2))
    with pytest.raises(InputFileError, match=r"models.json:\d+: model 'b': field 'input_price'") as ei:
        load_prices(p)
    assert ei.value.line == 6
    p.write_text(json.dumps({"a": {"input_price": 0.1}}))
    with pytest.raises(InputFileError, match="output_price missing"):
        load_prices(p)
    p.write_text("{]")
    with pytest.raises(InputFileError, match="invalid JSON"):
        load_prices(p)
    q = write_matrix(tmp_path, queries(), models={"tiny": MODELS["tiny"], "big": MODELS["big"]})
    with pytest.raises(ShadowError, match="no price for model"):
        load_matrix(q)
    q2 = tmp_path / "sub" / "q.json"
    q2.parent.mkdir()
    q2.write_text(json.dumps(queries()))
    with pytest.raises(ShadowError, match="no price file"):
        load_matrix(q2)
