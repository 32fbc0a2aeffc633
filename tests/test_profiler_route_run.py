"""route-run policies on scripted models (traces worked out by hand), prompts, local tokenizers and weights."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from profiler.latency import ProfileError  # noqa: E402
from profiler.route_run import load_prompts, run_routing_policy  # noqa: E402
from profiler.trace import RoutingTraceRecorder, read_trace_records  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
V = 16


class ScriptedLM(torch.nn.Module):
    """Next-token logits depend only on the last input token: peaked on (t + 1) % V, or flat when ``flat(t)``."""

    def __init__(self, flat, vocab=V):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab)
        self.flat = flat
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return torch.device("cpu")

    def forward(self, input_ids, cache=None, use_cache=None, logits_to_keep=None):
        b, T = input_ids.shape
        logits = torch.zeros(b, T, self.vocab)
        for t in range(T):
            last = int(input_ids[0, t])
            if not self.flat(last):
                logits[0, t, (last + 1) % self.vocab] = 20.0
        return SimpleNamespace(logits=logits)


def record(tmp_path, models, prompts, **kw):
    path = tmp_path / "t.jsonl"
    with RoutingTraceRecorder(path) as rec:
        res = run_routing_policy(models, prompts, recorder=rec, **kw)
    rows = [(r.step, r.model, r.next_model, int(r.committed_tokens)) for r in read_trace_records(path)]
    return res, rows


def test_confidence_policy_hand_trace(tmp_path):
    small = ScriptedLM(lambda t: t % 2 == 1)  # unsure after odd tokens
    large = ScriptedLM(lambda t: False)
    res, rows = record(tmp_path, [small, large], [[2]], policy="confidence", tau=0.5, max_new_tokens=4)
    # 2 -> small commits 3; unsure on 3: escalate (nothing committed); large commits 4, returns; small commits 5;
    # unsure on 5: escalate; large commits 6 = 4th token -> end
    assert rows == [(0, 0, 0, 1), (1, 0, 1, 0), (2, 1, 0, 1), (3, 0, 0, 1), (4, 0, 1, 0), (5, 1, -1, 1)]
    assert res.outputs == ((3, 4, 5, 6),) and res.steps_per_model == (4, 2) and res.committed_tokens == 4


def test_entropy_policy_hand_trace(tmp_path):
    small = ScriptedLM(lambda t: t % 2 == 1)
    large = ScriptedLM(lambda t: t % 5 == 0)  # the large model is unsure after multiples of 5
    res, rows = record(tmp_path, [small, large], [[2]], policy="entropy", tau=0.5, max_new_tokens=5)
    # small: 3 | unsure on 3 -> large | large commits 4, sure -> back | small commits 5 | unsure on 5 -> large |
    # large unsure on 5: commits argmax of flat logits = 0 and keeps control | large unsure on 0: commits 0, end
    assert rows == [(0, 0, 0, 1), (1, 0, 1, 0), (2, 1, 0, 1), (3, 0, 0, 1), (4, 0, 1, 0), (5, 1, 1, 1),
                    (6, 1, -1, 1)]
    assert res.outputs == ((3, 4, 5, 0, 0),)


def test_ensemble_policy_weights_and_eos(tmp_path):
    a, b, c = (ScriptedLM(lambda t: False) for _ in range(3))
    res, rows = record(tmp_path, [a, b, c], [[1], [7]], policy="ensemble", weights=[0.0, 0.0, 1.0],
                       max_new_tokens=10, eos_token_id=4)
    # request 0: model 0 commits 2, then model 2 commits 3, 4 = eos; request 1: 8..: 10 tokens, all after step 0
    # on model 2
    steps0 = [r for r in rows[:3]]
    assert steps0 == [(0, 0, 2, 1), (1, 2, 2, 1), (2, 2, -1, 1)]
    assert res.outputs[0] == (2, 3, 4) and len(res.outputs[1]) == 10
    assert all(m == 2 for (_, m, _, _) in rows[4:])


def test_policy_argument_errors():
    m = [ScriptedLM(lambda t: False), ScriptedLM(lambda t: False)]
    with pytest.raises(ProfileError, match="--tau"):
        run_routing_policy(m, [[1]], policy="entropy")
    with pytest.raises(ProfileError, match="exactly 2"):
        run_routing_policy(m + m[:1], [[1]], policy="confidence", tau=0.5)
    with pytest.raises(ProfileError, match="--policy"):
        run_routing_policy(m, [[1]], policy="nope")
    with pytest.raises(ProfileError, match="different vocabularies"):
        run_routing_policy([m[0], ScriptedLM(lambda t: False, vocab=V + 1)], [[1]], policy="ensemble")
    with pytest.raises(ProfileError, match="--max-new-tokens"):
        run_routing_policy(m, [[1]], policy="ensemble", max_new_tokens=0)


def test_text_prompts_with_local_tokenizer_and_real_weights_folder(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 200)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    tok_dir = tmp_path / "tok"
    fast.save_pretrained(tok_dir)
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"text": "w5 w7 w9"}) + "\n" + json.dumps([3, 4]) + "\n\n")
    assert load_prompts(str(p), str(tok_dir), 256) == [[5, 7, 9], [3, 4]]
    with pytest.raises(ProfileError, match="--tokenizer"):
        load_prompts(str(p), None, 256)
    # a real-weights model folder (save_pretrained of a tiny random model) through tr-profile latency
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256)
    model_dir = tmp_path / "tiny-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(model_dir)
    from profiler.cli import main
    rc = main(["latency", "--model", str(model_dir), "--batch-sizes", "1", "2", "--context", "8", "--steps", "3",
               "--out", str(tmp_path / "lat.json")])
    assert capsys.readouterr().out == ""  # --out receives what stdout would get: the profile (json by extension)
    doc = json.loads((tmp_path / "lat.json").read_text())
    assert rc == 0 and doc["model"] == "tiny-llama" and len(doc["batches"]) == 2
