"""RAGEN's simple envs (bandit, frozen_lake, countdown): step-for-step equal to RAGEN's classes, invalid actions
as penalised no-ops, experts that succeed, and a short training run on each.

``data/ragen_env_traces.json`` holds traces of RAGEN's own classes (mll-lab-nu/RAGEN 20daedc, ragen/env/<name>/,
run unmodified on this machine with gymnasium 1.4; Countdown with its parquet loader replaced by the listed
problems): explicit rows, and sha256 digests (first 16 hex digits) of the JSON of longer traces. The rows and the
digests below are rebuilt from our envs with the same seeds and action rules.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import micro_config
from ragen_turn.envs import REGISTERED_ENVS, make_env, make_env_config
from ragen_turn.envs.bandit import BanditEnv
from ragen_turn.envs.countdown import CountdownEnv, evaluate, generate_problem, has_plus_minus_solution
from ragen_turn.envs.countdown.config import CountdownEnvConfig
from ragen_turn.envs.frozen_lake import FrozenLakeEnv, generate_map

TRACES = json.loads((Path(__file__).parent / "data" / "ragen_env_traces.json").read_text())


def digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def same_step(got, want):
    """(obs, reward, done) equal and RAGEN's info keys equal."""
    return got[0] == want[0] and got[1] == want[1] and got[2] == want[2]


# ---------------------------------------------------------------- step for step against RAGEN's traces
def bandit_rows(split, internal, seeds, rule):
    env = BanditEnv(split=split, internal_seed=internal)
    rows = []
    for s in seeds:
        env.reset(seed=s)
        a = rule(s)
        obs, r, d, info = env.step(a)
        rows.append([s, env.ACTION_LOOKUP[1], env.ACTION_LOOKUP[2], a, obs, float(r), d, info["success"]])
    return rows


def test_bandit_is_ragens_step_for_step():
    rows = (bandit_rows("train", 0, [0, 1, 2, 3, 7, 42], lambda s: 1 + s % 2)
            + bandit_rows("test", 5, [0, 11, 123456789], lambda s: 2 - s % 2))
    assert rows == TRACES["bandit_rows"]
    for key, want in TRACES["bandit_digest"].items():
        split, internal = key.split("/")
        got = bandit_rows(split, int(internal), range(400), lambda s: 1 + (s * 7) % 2 if s % 3 else 2)
        assert digest(got) == want, key


def test_bandit_first_observation_is_ragens_text():
    env = BanditEnv(internal_seed=0)
    obs = env.reset(seed=3)
    a, b = env.ACTION_LOOKUP[1], env.ACTION_LOOKUP[2]
    assert (a, b) == ("Nurse", "StartupFounder") and env.config.action_lookup == {1: a, 2: b}
    assert obs.startswith("You are playing a bandit game. Goal: Maximize your total reward by choosing which arm "
                          "to pull. \nGame Rules: \n1. There are 2 arms, named Nurse and StartupFounder\n")
    assert obs.endswith("output like <answer> Nurse </answer> or <answer> StartupFounder </answer>.\n")


def test_bandit_envs_built_one_after_another_get_ragens_offsets():
    """RAGEN's rule: the n-th env built adds n to the reset seed, so the rollouts of a group differ."""
    e1, e2 = BanditEnv(), BanditEnv()
    assert e2.internal_seed == e1.internal_seed + 1
    ref = BanditEnv(internal_seed=e2.internal_seed)
    assert e2.reset(seed=10) == ref.reset(seed=10)
    assert e2.step(1) == ref.step(1)


def frozen_rows(kw, seeds, rule, n=10):
    env = FrozenLakeEnv(**kw)
    rows = []
    for s in seeds:
        trace = [env.reset(seed=s)]
        for t in range(n):
            a = rule(s, t)
            obs, r, d, info = env.step(a)
            trace.append([a, obs, float(r), d, info["success"], info["action_is_effective"]])
            if d:
                break
        rows.append(trace)
    return rows


def fl_rule(s, t):
    return 1 + (s * 31 + t * 17 + t * t) % 4


FL_CONFIGS = {"default": {}, "grid_coord": dict(observation_format="grid_coord"),
              "coord6": dict(observation_format="coord", size=6, p=0.8), "not_slippery": dict(is_slippery=False),
              "size8": dict(size=8, p=0.85, success_rate=1 / 3)}


def test_frozen_lake_is_ragens_step_for_step():
    assert frozen_rows({}, [0, 1, 5], fl_rule, 6) == TRACES["fl_rows"]
    for name, kw in FL_CONFIGS.items():
        assert digest(frozen_rows(kw, range(300), fl_rule)) == TRACES["fl_digest"][name], name


def test_frozen_lake_hand_case():
    """Seed 0 (RAGEN's): the player right of the goal; Left reaches it (reward 1, done, success)."""
    env = FrozenLakeEnv()
    assert env.reset(seed=0) == "__GP\n_O__\n_O__\n____" and env.config.map_seed == 0
    assert env.step("left") == ("__√_\n_O__\n_O__\n____", 1.0, True,
                                {"success": True, "action_is_valid": True, "action_is_effective": True})
    assert generate_map(4, 0.9, 0) == ["FFGS", "FHFF", "FHFF", "FFFF"]
    coord = FrozenLakeEnv(observation_format="coord")
    assert coord.reset(seed=0) == ("Board size: 4 rows x 4 cols (zero-indexed).\nStart: (0, 3)\nGoal: (0, 2)\n"
                                   "Player: (0, 3)\nHoles: (1, 1), (2, 1)")


def test_countdown_scoring_is_ragens():
    env = CountdownEnv()
    for nums, target, first, answer, obs, reward, done, success, effective in TRACES["cd_rows"]:
        env.data = [{"nums": nums, "target": target}]  # RAGEN's rule on a problem list: row seed % len
        assert env.reset(seed=0) == first
        got = env.step(answer)
        assert got == (obs, reward, done, {"success": success, "action_is_valid": True,
                                           "action_is_effective": effective}), answer
        assert type(got[1]) is type(reward)  # RAGEN's text says "1 points" for the int score, "0.1" for the float


def test_countdown_parses_and_never_evals():
    assert evaluate("(3 - 5) * 2") == -4 and evaluate(" 7 // 2 + 1") == 4 and evaluate("2 ** 3 ** 2") == 512
    for bad in ("__import__('os')", "().__class__", "[1, 2]", "x + 1", "1 +", "3 / 0", "9 ** 9 ** 9", "2 ** 65"):
        assert evaluate(bad) is None, bad
    env = CountdownEnv()
    env.data = [{"nums": [2, 9, 9], "target": 7}]
    env.reset(seed=0)
    assert env.step("9 ** 9 ** 2")[1] == 0.1  # RAGEN would compute this number for minutes; ours calls it wrong


def test_countdown_generated_problems():
    cfg = CountdownEnvConfig()
    probs = [generate_problem(s, cfg) for s in range(500)]
    assert probs == [generate_problem(s, cfg) for s in range(500)]
    assert all(3 <= len(p["nums"]) <= 4 and all(1 <= x <= 99 for x in p["nums"]) and 1 <= p["target"] <= 100
               and has_plus_minus_solution(p["nums"], p["target"]) for p in probs)
    assert len({(p["target"], tuple(p["nums"])) for p in probs}) > 490
    assert {len(p["nums"]) for p in probs} == {3, 4}


def test_countdown_reads_ragens_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"target": 4, "nums": [3, 5, 2]}, {"target": 98, "nums": [1, 2, 3]}, {"target": 28, "nums": [44, 19, 35]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    env = CountdownEnv(train_path=str(tmp_path / "train.parquet"))
    assert env.data == [rows[0], rows[2]]  # [1, 2, 3] cannot make 98 with + and -: dropped, as RAGEN does
    assert env.reset(seed=5) == "Target: 28, nums: [44, 19, 35]"


# ---------------------------------------------------------------- invalid actions, experts, state
@pytest.mark.parametrize("name", ["bandit", "frozen_lake"])
def test_malformed_actions_are_penalised_no_ops(name):
    env = make_env(name)
    first = env.reset(seed=4)
    for bad in (None, 3.5, "", "jump", 99, 0, -1, True, b"\xff", {"a": 1}, [1], "Left || Up"):
        obs, r, done, info = env.step(bad)
        assert (obs, r, done) == (first, -0.1, False), bad
        assert info["action_is_valid"] is False and info["action_is_effective"] is False and not info["success"]
    obs, r, done, info = env.step(env.get_all_actions()[0])
    assert info["action_is_valid"] is True


def test_countdown_non_text_action_is_a_penalised_no_op():
    env = CountdownEnv()
    first = env.reset(seed=1)
    for bad in (None, 3, 2.5, ["1 + 2"]):
        assert env.step(bad)[:3] == (first, -0.1, False)
    assert env.step("not an equation")[1:3] == (0, True)


def test_experts_succeed():
    bandit = BanditEnv()
    for s in range(100):
        bandit.reset(seed=s)
        assert bandit.step(bandit.solve()[0])[3]["success"]
    lake = FrozenLakeEnv(is_slippery=False)
    for s in range(100):
        lake.reset(seed=s)
        for a in lake.solve():
            lake.step(a)
        assert lake.success and lake.done
    slippery, wins = FrozenLakeEnv(), 0
    for s in range(200):  # replanning after each slip
        slippery.reset(seed=s)
        for _ in range(10):
            if slippery.done:
                break
            slippery.step(slippery.solve()[0])
        wins += slippery.success
    assert wins / 200 > 0.85
    countdown = CountdownEnv()
    for s in range(300):
        countdown.reset(seed=s)
        assert countdown.step(countdown.solve()[0])[1] == 1


def test_frozen_lake_state_round_trip():
    env = FrozenLakeEnv(size=6, p=0.8)
    env.reset(seed=12)
    state = env.get_state()
    first = [env.step(a) for a in (2, 3, 3, 2, 4)]
    env.set_state(state)
    assert [env.step(a) for a in (2, 3, 3, 2, 4)] == first
    twin = env.copy()
    assert [twin.step(a) for a in (1, 2)] == [env.step(a) for a in (1, 2)]


def test_bandit_state_round_trip():
    env = BanditEnv(internal_seed=3)
    env.reset(seed=8)
    state = env.get_state()
    hi = [k for k, v in env.ACTION_LOOKUP.items() if v == env.hi_arm_name][0]
    first = env.step(hi)
    env.set_state(state)
    assert env.step(hi) == first


@pytest.mark.parametrize("name,bad,match", [
    ("bandit", {"split": "val"}, "split"), ("bandit", {"hi_arm_hiscore_prob": 1.5}, "hi_arm_hiscore_prob"),
    ("bandit", {"internal_seed": "x"}, "internal_seed"), ("frozen_lake", {"size": 1}, "size"),
    ("frozen_lake", {"p": 0}, "env_config.p"), ("frozen_lake", {"observation_format": "image"}, "observation_format"),
    ("frozen_lake", {"action_map": {1: 0}}, "action_map"), ("countdown", {"max_numbers": 2}, "max_numbers"),
    ("countdown", {"score": "one"}, "score"), ("countdown", {"no_such_key": 1}, "unknown key"),
])
def test_bad_env_configs_name_the_key(name, bad, match):
    with pytest.raises(ValueError, match=match):
        make_env_config(name, bad)


# ---------------------------------------------------------------- they train
@pytest.mark.parametrize("name,algo", [("bandit", "grpo"), ("frozen_lake", "turn_ppo"), ("countdown", "grpo")])
def test_ragen_simple_envs_train_two_steps_after_a_warm_start(name, algo, tmp_path, monkeypatch):
    from ragen_turn.engines.local.trainer import build_trainer

    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path / "cache"))  # the warm start is built here, not loaded

    assert name in REGISTERED_ENVS
    cfg = micro_config([f"env={name}", f"algo={algo}", "model.warmstart.enable=true", "model.warmstart.episodes=8",
                        "model.warmstart.steps=2", "model.warmstart.batch_size=4",
                        "actor_rollout_ref.rollout.response_length=24"], run_dir=tmp_path / "run")
    lines = []
    trainer = build_trainer(cfg, log=lines.append)
    assert any(line.startswith("[warmstart]") and "demonstrations" in line for line in lines), lines
    last = trainer.fit()
    assert last["step"] == 2
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in steps if "env/reward" in m]) == 2


def test_bandit_offsets_are_the_slot_index_in_the_env_manager():
    """Held-out Bandit episodes do not depend on how many envs the process built before (a warm start, train envs)."""
    from ragen_turn.rollout.env_manager import EnvGroupManager

    custom = {"Bandit": {"env_type": "bandit", "env_config": {"split": "test"}, "max_actions_per_traj": 1}}
    split = {"env_groups": 3, "group_size": 2, "env_configs": {"tags": ["Bandit"], "n_groups": [3]}}
    first = EnvGroupManager(custom, split, "val")
    BanditEnv(), BanditEnv()  # more envs built in between
    again = EnvGroupManager(custom, split, "val")
    assert [s.env.internal_seed for s in again.slots] == [0, 1, 2, 3, 4, 5]
    texts = lambda m: [s.env.reset(seed=s.seed) for s in m.assign_seeds(0, 0)]  # noqa: E731
    assert texts(first) == texts(again)
    pinned = EnvGroupManager({"Bandit": {**custom["Bandit"], "env_config": {"internal_seed": 7}}}, split, "val")
    assert {s.env.internal_seed for s in pinned.slots} == {7}
