"""Rollout layer: prompts and token layout, action parsing, scripted solver rollouts."""
from __future__ import annotations

import pytest
import torch

from ragen_turn.rollout import (
    ChatFormatter,
    ContextConfig,
    EnvGroupManager,
    Episode,
    TextPolicy,
    Trajectory,
    VAL_SEED_OFFSET,
    parse_response,
    run_episodes,
)

from ragen_turn.rollout.env_manager import DEV_SEED_OFFSET

from helpers import micro_config, tiny_tokenizer


@pytest.mark.parametrize("text,think,expected", [
    ("<answer>Up</answer>", False, (["Up"], True)),
    ("<answer> up || Left ||  </answer>", False, (["up", "Left"], True)),
    ("<think>go</think><answer>Right</answer>", True, (["Right"], True)),
    ("<answer>Right</answer>", True, ([], False)),  # think block required when enable_think
    ("Up", False, ([], False)),
    ("", False, ([], False)),
    ("<answer></answer>", False, ([], False)),
    ("<answer>Up", False, ([], False)),
    ("x" * 10_000, False, ([], False)),
    ("<answer>" + " || ".join(["Up"] * 9) + "</answer>", False, (["Up"] * 5, True)),
    # RAGEN searches for the answer: text before it is fine, and a think block without enable_think too
    ("I should go up. <answer>Up</answer>", False, (["Up"], True)),
    ("<think>box is left</think><answer>Left</answer>", False, (["Left"], True)),
    ("plan: <think>a</think>\n <answer>Down</answer> trailing", True, (["Down"], True)),
    ("<think>a</think> then <answer>Down</answer>", True, ([], False)),  # only whitespace between them
    ("<answer>Up<|im_end|> || <think>Left</answer>", False, (["Up", "Left"], True)),  # tags inside are removed
    ("<answer>Up</answer><answer>Down</answer>", False, (["Up"], True)),  # the first answer counts
    ("<answer>1 || 3</answer>", False, (["1", "3"], True)),  # parsed; the env-state step drops them
])
def test_parse_response(text, think, expected):
    assert parse_response(text, ContextConfig(enable_think=think)) == expected


def test_chat_template_layout_and_response_mask():
    tok = tiny_tokenizer()
    f = ChatFormatter(tok)
    first = f.first_prompt("SYS", "hello")
    text = tok.decode(first)
    assert text.startswith("<|im_start|>system") and text.rstrip().endswith("<|im_start|>assistant")
    resp = f.encode("<answer>Up</answer>") + [tok.convert_tokens_to_ids("<|im_end|>")]
    nxt = f.env_turn("next obs", resp)
    # the template's end-of-message is not repeated when the model sampled it
    assert tok.decode(nxt).startswith("\n<|im_start|>user")
    nxt2 = f.env_turn("next obs", resp[:-1])
    assert tok.decode(nxt2).startswith("<|im_end|>")


def _solver_policy(tok, per_turn=5, sep=" || "):
    def respond(slot):
        names = [slot.env.ACTION_LOOKUP[a] for a in slot.env.solve()[:per_turn]]
        return "<answer>" + sep.join(names) + "</answer>"
    return TextPolicy(tok, respond)


def test_scripted_solver_rollout_reaches_success_one():
    cfg = micro_config(["custom_envs.SimpleSokoban.max_actions_per_traj=100", "agent_proxy.max_turn=10",
                        "actor_rollout_ref.rollout.response_length=16",
                        "es_manager.train.env_groups=12", "es_manager.train.group_size=1"])
    tok = tiny_tokenizer()
    from ragen_turn.rollout import context_config

    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    eps = run_episodes(envs.assign_seeds(0, 0), _solver_policy(tok), ChatFormatter(tok), context_config(cfg))
    assert len(eps) == 12
    assert all(e.success for e in eps)
    assert all(e.format_errors == 0 and e.num_valid_actions == e.num_actions for e in eps)
    # the last turn's reward holds the +10 of solving
    assert all(e.turn_rewards[-1] > 9 for e in eps)
    batch = Trajectory.from_episodes(eps, tok.pad_token_id)
    # response_mask covers exactly the sampled answers, never template tokens
    for b, e in enumerate(eps):
        resp_text = tok.decode(batch.input_ids[b][batch.response_mask[b].bool()].tolist())
        assert "<|im_start|>" not in resp_text and "<|im_end|>" not in resp_text
        assert resp_text.count("<answer>") == e.num_turns
    # turn ids agree with the runs of the response mask
    from ragen_turn.algos import turn_ids_from_mask
    assert torch.equal(turn_ids_from_mask(batch.response_mask), batch.turn_ids)


def test_malformed_responses_are_penalised_not_crashes():
    cfg = micro_config(["agent_proxy.max_turn=3"])
    tok = tiny_tokenizer()
    from ragen_turn.rollout import context_config

    junk = iter(["jump!!", "<answer>dance || Up</answer>", "\u00e9\u00e8 " * 50])
    envs = EnvGroupManager(cfg.custom_envs, {"env_groups": 1, "group_size": 1,
                                             "env_configs": {"tags": ["SimpleSokoban"], "n_groups": [1]}}, "train")
    policy = TextPolicy(tok, lambda slot: next(junk))
    lines = []
    (ep,) = run_episodes(envs.assign_seeds(0, 0), policy, ChatFormatter(tok), context_config(cfg), log=lines.append)
    assert [line.split(":")[0] for line in lines] == ["[rollout] turn 1/3", "[rollout] turn 2/3", "[rollout] turn 3/3"]
    assert all("1/1 episodes active" in line for line in lines)
    assert ep.num_turns == 3 and ep.format_errors == 2
    # RAGEN's rule: "dance" is dropped before the env, "Up" is stepped, one penalty for the turn
    assert ep.num_actions == 1 and ep.num_valid_actions == 1 and ep.num_dropped_actions == 1
    assert ep.turn_rewards[0] == pytest.approx(-0.1)
    assert ep.turn_rewards[1] == pytest.approx(-0.1 + -0.1)  # the penalty + Up's step cost


def test_throttled_log_drops_lines_within_the_interval(monkeypatch):
    from ragen_turn.rollout import runner

    clock = iter([0.0, 5.0, 12.0, 13.0, 30.0])
    monkeypatch.setattr(runner.time, "time", lambda: next(clock))
    lines = []
    emit = runner.throttled(lines.append, 10.0)  # reads the clock once (t=0)
    for name in ["a", "b", "c", "d"]:  # at t=5 (dropped), 12 (kept), 13 (dropped), 30 (kept)
        emit(name)
    assert lines == ["b", "d"]


def test_context_limit_truncates_episode():
    cfg = micro_config(["agent_proxy.max_turn=5", "agent_proxy.max_context_tokens=160"])
    tok = tiny_tokenizer()
    from ragen_turn.rollout import context_config

    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    policy = TextPolicy(tok, lambda slot: "<answer>Up</answer>")
    eps = run_episodes(envs.assign_seeds(0, 0), policy, ChatFormatter(tok), context_config(cfg))
    assert all(len(e.token_ids) <= 160 for e in eps)
    assert all(e.truncated and 1 <= e.num_turns < 5 for e in eps)
    too_small = micro_config(["agent_proxy.max_context_tokens=40"])
    with pytest.raises(ValueError, match="max_context_tokens"):
        run_episodes(envs.assign_seeds(0, 0), policy, ChatFormatter(tok), context_config(too_small))


def test_seeds_groups_and_val_split():
    cfg = micro_config(["es_manager.train.env_groups=3", "es_manager.train.group_size=2"])
    train = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    s0 = [s.seed for s in train.assign_seeds(0, 0)]
    assert s0[0] == s0[1] and s0[2] == s0[3] and len(set(s0)) == 3  # G rollouts share a seed
    assert [s.seed for s in train.assign_seeds(0, 0)] == s0  # reproducible
    assert [s.seed for s in train.assign_seeds(0, 1)] != s0  # fresh seeds each step
    assert max(s0) < VAL_SEED_OFFSET
    val = EnvGroupManager(cfg.custom_envs, cfg.es_manager.val, "val")
    held = [s.seed for s in val.assign_seeds(0, 5)]
    assert min(held) >= VAL_SEED_OFFSET
    dev_cfg = micro_config(["es_manager.val.seeds=dev"])
    dev = [s.seed for s in EnvGroupManager(dev_cfg.custom_envs, dev_cfg.es_manager.val, "val").assign_seeds(0, 5)]
    assert min(dev) >= DEV_SEED_OFFSET and not set(dev) & set(held)  # a tuning range: neither held-out nor train
    with pytest.raises(ValueError, match="es_manager.val.seeds"):
        bad = micro_config(["es_manager.val.seeds=test"])
        EnvGroupManager(bad.custom_envs, bad.es_manager.val, "val")
    with pytest.raises(ValueError, match="n_groups"):
        EnvGroupManager(cfg.custom_envs, {"env_groups": 2, "group_size": 1,
                                          "env_configs": {"tags": ["SimpleSokoban"], "n_groups": [3]}})
    with pytest.raises(ValueError, match="custom_envs"):
        EnvGroupManager(cfg.custom_envs, {"env_groups": 1, "group_size": 1,
                                          "env_configs": {"tags": ["Nope"], "n_groups": [1]}})


# ---------------------------------------------------------------- RAGEN's env-state step
def _one_slot(cfg_overrides, tag="SimpleSokoban"):
    cfg = micro_config(["actor_rollout_ref.rollout.response_length=64"] + cfg_overrides)
    return cfg, EnvGroupManager(cfg.custom_envs, {"env_groups": 1, "group_size": 1,
                                                  "env_configs": {"tags": [tag], "n_groups": [1]}}, "train")


@pytest.mark.parametrize("answer,stepped,dropped,first_reward", [
    ("<answer>1 || 3</answer>", 0, 2, -0.1),                    # ids are not names: invalid, as in RAGEN
    ("<answer>dance || up || jump</answer>", 1, 2, -0.2),       # one penalty for the turn + Up's step cost
    ("<answer>UP || Left</answer>", 2, 0, None),                # names match case-insensitively
    ("I think <answer>Up</answer>", 1, 0, -0.1),                # text before the answer is fine
    ("<answer> </answer>", 0, 0, -0.1),                         # empty answer: the format penalty, once
])
def test_invalid_actions_are_dropped_before_the_env_with_one_penalty(answer, stepped, dropped, first_reward):
    from ragen_turn.rollout import context_config

    tok = tiny_tokenizer()
    cfg, envs = _one_slot(["agent_proxy.max_turn=1"])
    slot = envs.assign_seeds(0, 0)[0]
    seen = []
    real_step = slot.env.step
    slot.env.step = lambda a: (seen.append(a), real_step(a))[1]
    (ep,) = run_episodes([slot], TextPolicy(tok, lambda s: answer), ChatFormatter(tok), context_config(cfg))
    assert len(seen) == stepped and all(type(a) is int for a in seen)  # ids reach the env, never names
    assert slot.env.num_env_steps == stepped and ep.num_actions == stepped
    assert ep.num_dropped_actions == dropped
    if first_reward is not None:
        assert ep.turn_rewards[0] == pytest.approx(first_reward)


def test_dropped_actions_do_not_use_the_action_budget():
    from ragen_turn.rollout import context_config

    tok = tiny_tokenizer()
    cfg, envs = _one_slot(["agent_proxy.max_turn=3", "custom_envs.SimpleSokoban.max_actions_per_traj=2"])
    answers = iter(["<answer>fly || fly || fly || Up</answer>", "<answer>Down || Up || Down</answer>",
                    "<answer>Up</answer>"])
    (ep,) = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda s: next(answers)), ChatFormatter(tok),
                         context_config(cfg))
    assert ep.num_actions == 2 and ep.num_dropped_actions == 3 and ep.num_turns == 2  # budget spent on turn 2


def test_ragen_style_envs_get_ids_from_names_read_each_turn():
    """RAGEN's discrete envs assert on anything but their ids; the lookup may change at each reset."""
    import ragen_style_envs as rs
    from ragen_turn.rollout import context_config

    tok = tiny_tokenizer()
    cfg = micro_config(["agent_proxy.max_turn=4", "actor_rollout_ref.rollout.response_length=64"])
    custom = {"Doors": {"env_type": "two_doors", "max_actions_per_traj": 1},
              "Corridor": {"env_type": "corridor", "max_actions_per_traj": 10, "env_config": {"length": 4}}}
    for tag, answer in (("Doors", "<answer>gold</answer>"), ("Corridor", "<answer>Right || Right || Right</answer>")):
        envs = EnvGroupManager(custom, {"env_groups": 4, "group_size": 2,
                                        "env_configs": {"tags": [tag], "n_groups": [4]}}, "train")
        before = sum(rs.STEPS.values())
        eps = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda s: answer), ChatFormatter(tok),
                           context_config(cfg))
        assert all(e.success and e.num_dropped_actions == 0 for e in eps), tag
        assert sum(rs.STEPS.values()) - before == sum(e.num_actions for e in eps) > 0
    # an unknown name (or an id) never reaches the env's assertion
    envs = EnvGroupManager(custom, {"env_groups": 1, "group_size": 1,
                                    "env_configs": {"tags": ["Doors"], "n_groups": [1]}}, "train")
    (ep,) = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda s: "<answer>Banker || 1</answer>"),
                         ChatFormatter(tok), context_config(cfg))
    assert ep.num_actions == 0 and ep.num_turns == 4 and ep.num_dropped_actions == 2 * 4
    assert ep.turn_rewards == pytest.approx([-0.1] * 4)


def test_trajectory_to_is_a_copy_and_positions_follow_the_mask():
    from ragen_turn.models.logprobs import positions_from_mask

    eps = [Episode(token_ids=[5, 6, 7], response_mask=[0, 1, 1], turn_ids=[-1, 0, 0], turn_rewards=[1.0],
                   group_id=0, env_seed=0),
           Episode(token_ids=[5, 6], response_mask=[0, 1], turn_ids=[-1, 0], turn_rewards=[0.0], group_id=0,
                   env_seed=1)]
    batch = Trajectory.from_episodes(eps, pad_token_id=0)
    batch.old_logp = torch.zeros(2, 3)
    moved = batch.to("meta")
    assert moved is not batch and moved.episodes is batch.episodes
    assert all(getattr(moved, k).device.type == "meta" for k in ("input_ids", "turn_mask", "old_logp"))
    assert batch.input_ids.device.type == "cpu" and moved.values is None
    assert batch.position_ids.tolist() == [[0, 1, 2], [0, 1, 1]] == positions_from_mask(batch.attention_mask).tolist()


def test_micro_batches_group_rows_of_similar_length_and_cover_each_row_once():
    lengths = [7, 2, 9, 4, 4, 1, 8]
    eps = [Episode(token_ids=list(range(1, n + 1)), response_mask=[0] * (n - 1) + [1], turn_ids=[-1] * (n - 1) + [0],
                   turn_rewards=[0.0], group_id=i, env_seed=i) for i, n in enumerate(lengths)]
    batch = Trajectory.from_episodes(eps, pad_token_id=0)
    chunks = batch.micro_batches(3)
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(lengths)))
    assert [[lengths[i] for i in c.tolist()] for c in chunks] == [[1, 2, 4], [4, 7, 8], [9]]
    # selected, a chunk is as wide as its longest row: 4 columns here, where the batch has 9
    assert batch.select(chunks[0]).input_ids.shape == (3, 4)
    assert [len(c) for c in batch.micro_batches(100)] == [7]


def test_padding_split_cuts_where_padding_plus_a_row_per_chunk_is_least():
    """``micro_batches(size, "padding")``: every row once, at most ``size`` rows a chunk, length-sorted, and the
    cut points minimise sum over chunks of (rows + 1) x longest (checked against every way to cut small cases)."""
    import itertools
    import random

    from ragen_turn.rollout.trajectory import padding_split

    def cost(lengths, points):
        return sum((b - a + 1) * lengths[b - 1] for a, b in zip(points[:-1], points[1:]))

    rng = random.Random(0)
    for _ in range(200):
        n, size = rng.randint(1, 8), rng.randint(1, 5)
        lengths = sorted(rng.choice([rng.randint(1, 20), rng.randint(50, 60)]) for _ in range(n))
        points = padding_split(lengths, size)
        assert points[0] == 0 and points[-1] == n and all(0 < b - a <= size for a, b in zip(points[:-1], points[1:]))
        best = min(cost(lengths, [0, *c, n]) for k in range(n) for c in itertools.combinations(range(1, n), k)
                   if all(0 < b - a <= size for a, b in zip([0, *c], [*c, n])))
        assert cost(lengths, points) == best
    assert padding_split([600, 700, 700, 800, 1000, 1150, 1400] + [1900] * 9, 16) == [0, 3, 6, 16]
    assert padding_split([5] * 6, 4) == [0, 2, 6]  # equal rows: two chunks, the last as large as it may be
    lengths = [7, 2, 9, 4, 4, 1, 8, 30, 31]
    eps = [Episode(token_ids=list(range(1, n + 1)), response_mask=[0] * (n - 1) + [1], turn_ids=[-1] * (n - 1) + [0],
                   turn_rewards=[0.0], group_id=i, env_seed=i) for i, n in enumerate(lengths)]
    batch = Trajectory.from_episodes(eps, pad_token_id=0)
    chunks = batch.micro_batches(8, "padding")
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(lengths)))
    assert [[lengths[i] for i in c.tolist()] for c in chunks] == [[1], [2, 4, 4], [7, 8, 9], [30, 31]]  # 2+16+36+93
    assert [len(c) for c in batch.micro_batches(8)] == [8, 1]
    with pytest.raises(ValueError):
        batch.micro_batches(8, "tokens")
