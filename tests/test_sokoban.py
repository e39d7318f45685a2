"""Sokoban env adapter: generation, rendering, rules, rewards, parsing, solver, gymnasium wrapper."""
from __future__ import annotations

import random
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from ragen_turn.envs import REGISTERED_ENV_CONFIGS, REGISTERED_ENVS, make_env
from ragen_turn.envs.base import BaseDiscreteActionEnv
from ragen_turn.envs.sokoban import (
    SokobanEnv, SokobanEnvConfig, dead_squares, generate_room, grid_to_text, solve, text_to_grid,
)

DATA = Path(__file__).parent / "data"
UP, DOWN, LEFT, RIGHT = 1, 2, 3, 4


def room(text: str) -> SokobanEnv:
    env = SokobanEnv()
    env.set_room(text.strip("\n"), None)
    return env


def read_fixture(name: str):
    blocks = []
    header, lines = None, []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):  # comment (grid rows never contain spaces)
            continue
        if line.startswith("seed="):
            header, lines = line, []
            continue
        if line == "":
            if header is not None:
                fields = dict(kv.split("=") for kv in header.split())
                blocks.append((int(fields["seed"]), int(fields["optimal_steps"]), "\n".join(lines)))
                header = None
            continue
        lines.append(line)
    if header is not None:
        fields = dict(kv.split("=") for kv in header.split())
        blocks.append((int(fields["seed"]), int(fields["optimal_steps"]), "\n".join(lines)))
    return blocks


def bfs_length(env: SokobanEnv):
    """Independent brute-force shortest solution length, stepping copies of the env."""
    start = env.get_state()
    key = lambda st: (st[0], st[1])  # noqa: E731
    seen = {key(start)}
    queue = deque([(start, 0)])
    probe = env.copy()
    while queue:
        st, d = queue.popleft()
        for a in (UP, DOWN, LEFT, RIGHT):
            probe.set_state(st)
            _, _, _, info = probe.step(a)
            nst = probe.get_state()
            if info["success"]:
                return d + 1
            if key(nst) not in seen:
                seen.add(key(nst))
                queue.append((nst, d + 1))
    return None


# ---------------------------------------------------------------- config and registry
def test_registry_and_interface():
    assert REGISTERED_ENVS["sokoban"] is SokobanEnv
    assert REGISTERED_ENV_CONFIGS["sokoban"] is SokobanEnvConfig
    env = make_env("sokoban", {"dim_room": [7, 7], "num_boxes": 1, "max_steps": 50, "search_depth": 100})
    assert isinstance(env, BaseDiscreteActionEnv)
    obs = env.reset(seed=3)
    assert isinstance(obs, str) and obs.count("\n") == 6
    assert env.get_all_actions() == [1, 2, 3, 4]
    assert env.ACTION_LOOKUP == {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
    assert env.render() == obs and env.render(mode="text") == obs
    env.close()


def test_config_defaults_and_coercion():
    c = SokobanEnvConfig()
    assert (c.dim_room, c.max_steps, c.num_boxes, c.search_depth, c.format_penalty) == ((6, 6), 100, 1, 300, -0.1)
    assert c.grid_lookup == {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
    assert c.action_lookup == {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
    c = SokobanEnvConfig(dim_room=[8, 7], grid_lookup={str(k): v for k, v in c.grid_lookup.items()})
    assert c.dim_room == (8, 7) and c.grid_lookup[3] == "√"
    assert SokobanEnvConfig(dim_x=7, dim_y=9).dim_room == (7, 9)


@pytest.mark.parametrize("kwargs", [
    {"num_boxes": 0}, {"dim_room": (4, 4)}, {"dim_room": (2, 9)}, {"dim_room": (5, 5), "num_boxes": 8},
    {"dim_room": (6,)}, {"dim_room": "6x6"}, {"max_steps": 0}, {"search_depth": 0}, {"max_steps": 2.5},
    {"grid_lookup": {0: "#"}}, {"action_lookup": {1: "Up", 7: "Jump"}}, {"dim_x": 6},
    {"p_change_directions": 1.5}, {"format_penalty": "a lot"},
])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SokobanEnvConfig(**kwargs)


def test_make_env_rejects_unknown_key():
    with pytest.raises(ValueError, match="unknown key"):
        make_env("sokoban", {"dim_room": [6, 6], "boxes": 2})


# ---------------------------------------------------------------- generation and determinism
@pytest.mark.parametrize("fixture,cfg", [
    ("sokoban_6x6_1box.txt", {"dim_room": (6, 6), "num_boxes": 1}),
    ("sokoban_8x8_2box.txt", {"dim_room": (8, 8), "num_boxes": 2}),
])
def test_fixed_seed_rooms_match_stored_text(fixture, cfg):
    blocks = read_fixture(fixture)
    assert len(blocks) >= 5
    env = SokobanEnv(cfg)
    random.seed(999)
    np.random.seed(999)  # the generator must not read global RNG state
    for seed, optimal, text in blocks:
        assert env.reset(seed=seed) == text, f"seed {seed}"
        assert env.optimal_steps == optimal
        assert env.seed == seed


def test_same_seed_same_room_and_seeds_differ():
    a, b = SokobanEnv(), SokobanEnv()
    texts = [a.reset(seed=s) for s in range(20)]
    assert texts == [b.reset(seed=s) for s in range(20)]
    assert len(set(texts)) >= 15
    g1, g2 = generate_room((8, 8), 2, seed=77), generate_room((8, 8), 2, seed=77)
    assert np.array_equal(g1.room_fixed, g2.room_fixed) and np.array_equal(g1.room_state, g2.room_state)
    un1, un2 = SokobanEnv().reset(), SokobanEnv().reset()  # unseeded resets still work (fresh entropy)
    assert isinstance(un1, str) and isinstance(un2, str)


def test_generate_room_structure():
    g = generate_room((7, 9), 2, seed=5)
    fixed, state = g.room_fixed, g.room_state
    assert fixed.shape == state.shape == (7, 9)
    assert (fixed[0] == 0).all() and (fixed[-1] == 0).all() and (fixed[:, 0] == 0).all() and (fixed[:, -1] == 0).all()
    assert (fixed == 2).sum() == 2 and (state == 4).sum() == 2 and (state == 3).sum() == 0
    assert (state == 5).sum() == 1
    assert sorted(g.box_mapping) == sorted(map(tuple, np.argwhere(fixed == 2).tolist()))
    # the reverse-play path, played forwards, solves the room
    env = SokobanEnv({"dim_room": (7, 9), "num_boxes": 2})
    env.set_room(fixed, state)
    rewards = [env.step(a)[1] for a in g.action_sequence]
    assert env.success and len(g.action_sequence) >= env.optimal_steps
    assert rewards[-1] == pytest.approx(10.9)


def test_100_random_rooms_solvable_within_max_steps():
    env = SokobanEnv()
    for seed in range(100):
        env.reset(seed=seed)
        plan = env.solve()
        assert plan is not None and 1 <= len(plan) <= env.max_steps
        assert len(plan) == env.optimal_steps
        total = 0.0
        for i, a in enumerate(plan):
            _, r, done, info = env.step(a)
            total += r
            assert info["action_is_valid"]
            assert done == (i == len(plan) - 1)
        assert info["success"]
        assert total == pytest.approx(-0.1 * len(plan) + 10.0 + 1.0)  # one box: no push off its target
    big = SokobanEnv({"dim_room": (8, 8), "num_boxes": 2, "max_steps": 100})
    for seed in range(15):
        big.reset(seed=seed)
        plan = big.solve()
        assert plan is not None and len(plan) == big.optimal_steps <= big.max_steps
        for a in plan:
            big.step(a)
        assert big.success


def test_max_steps_bounds_generated_solutions():
    env = SokobanEnv({"dim_room": (8, 8), "num_boxes": 2, "max_steps": 12})
    for seed in range(10):
        env.reset(seed=seed)
        assert 1 <= env.optimal_steps <= 12


# ---------------------------------------------------------------- rendering
def test_render_symbols_and_one_char_per_cell():
    env = room("""
#######
#P_X_O#
#__√__#
#######""")
    obs = env.render()
    rows = obs.split("\n")
    assert len(rows) == 4 and all(len(r) == 7 for r in rows)
    assert set(obs) <= set("#_OX√PS\n")
    assert rows[1] == "#P_X_O#" and rows[2] == "#__√__#"
    f, s = text_to_grid(obs)
    assert grid_to_text(f, s) == obs
    assert (s == 3).sum() == 1 and (s == 4).sum() == 1 and (f == 2).sum() == 2
    spaced = env.render(mode="spaced")
    assert spaced.split("\n")[1] == "# P _ X _ O #"
    compact = SokobanEnv().reset(seed=0)
    assert SokobanEnv({"cell_sep": " "}).reset(seed=0) == "\n".join(" ".join(row) for row in compact.split("\n"))
    with pytest.raises(ValueError):
        env.render(mode="rgb_array")


def test_player_on_target_renders_S():
    env = room("""
######
#PO__#
#_X_O#
######""")
    obs, r, done, info = env.step(RIGHT)
    assert obs.split("\n")[1] == "#_S__#" and info["action_is_effective"] and not done
    assert r == pytest.approx(-0.1)
    obs, *_ = env.step(RIGHT)
    assert obs.split("\n")[1] == "#_OP_#"


def test_instruction_mentions_rules_symbols_actions():
    env = SokobanEnv()
    text = env.instruction
    for word in ("Sokoban", "push", "box", "target", "wall", "Up", "Down", "Left", "Right", "||"):
        assert word in text
    for sym in "#_OX√PS":
        assert sym in text
    assert SokobanEnv.INSTRUCTION == text


# ---------------------------------------------------------------- pushing rules and rewards
def test_walking_into_wall_is_valid_but_not_effective():
    env = room("""
######
#P_XO#
######""")
    before = env.render()
    obs, r, done, info = env.step(UP)
    assert obs == before and r == pytest.approx(-0.1) and not done
    assert info == {"success": False, "action_is_valid": True, "action_is_effective": False, "optimal_steps": 2}
    obs, r, done, info = env.step(LEFT)
    assert obs == before and not info["action_is_effective"]


def test_box_cannot_be_pushed_into_wall_or_box():
    env = room("""
######
#PX#O#
#___O#
#_X__#
######""")
    before = env.render()
    obs, r, _, info = env.step(RIGHT)  # box against a wall
    assert obs == before and r == pytest.approx(-0.1) and not info["action_is_effective"]
    env = room("""
#######
#PXX_O#
#____O#
#######""")
    before = env.render()
    obs, _, _, info = env.step(RIGHT)  # box against a box
    assert obs == before and not info["action_is_effective"] and info["action_is_valid"]
    env = room("""
#######
#PX√__#
#____O#
#######""")
    obs, _, _, info = env.step(RIGHT)  # box against a box on a target
    assert not info["action_is_effective"]


def test_push_moves_box_and_player():
    env = room("""
#######
#P_X_O#
#######""")
    obs, r, done, info = env.step(RIGHT)
    assert obs.split("\n")[1] == "#_PX_O#"
    obs, r, done, info = env.step(RIGHT)
    assert obs.split("\n")[1] == "#__PXO#" and r == pytest.approx(-0.1) and not done
    obs, r, done, info = env.step(RIGHT)
    assert obs.split("\n")[1] == "#___P√#"
    assert r == pytest.approx(10.9) and done and info["success"]
    assert env.boxes_on_target == 1 and env.num_env_steps == 3
    # after the episode ended nothing moves and nothing is paid
    obs2, r, done, info = env.step(LEFT)
    assert obs2 == obs and r == 0.0 and done and not info["action_is_effective"]


def test_scripted_reward_sequence_two_boxes():
    env = room("""
#######
#PXO_O#
#__X__#
#_____#
#######""")
    assert env.optimal_steps == 7
    script = [RIGHT, RIGHT, RIGHT, DOWN, DOWN, LEFT, UP]
    rewards, dones = [], []
    for a in script:
        _, r, d, info = env.step(a)
        rewards.append(r)
        dones.append(d)
    assert rewards == pytest.approx([0.9, -1.1, 0.9, -0.1, -0.1, -0.1, 10.9])
    assert dones == [False] * 6 + [True] and info["success"]
    assert env.render() == "#######\n#__√_√#\n#__P__#\n#_____#\n#######"


def test_push_between_targets_has_no_target_reward():
    env = room("""
#######
#PXOO_#
#_X___#
#######""")
    _, r1, *_ = env.step(RIGHT)
    _, r2, *_ = env.step(RIGHT)  # from one target onto the next
    assert (r1, r2) == pytest.approx((0.9, -0.1))


def test_episode_ends_after_max_steps_counting_invalid_actions():
    env = SokobanEnv({"max_steps": 4})
    env.set_room("#######\n#P_X_O#\n#######")
    outs = [env.step(a) for a in ("jump", LEFT, "", "Left")]
    assert [o[2] for o in outs] == [False, False, False, True]
    assert not outs[-1][3]["success"]
    assert [o[1] for o in outs] == pytest.approx([-0.1, -0.1, -0.1, -0.1])


# ---------------------------------------------------------------- action parsing
@pytest.mark.parametrize("action,expected", [
    ("up", UP), ("Up", UP), (" Right ", RIGHT), ("DOWN", DOWN), ("left\n", LEFT), ("3", LEFT), (" 4 ", RIGHT),
    (1, UP), (np.int64(2), DOWN), (b"Right", RIGHT),
])
def test_valid_action_forms(action, expected):
    env = SokobanEnv()
    env.reset(seed=0)
    assert env.parse_action(action) == expected
    _, r, _, info = env.step(action)
    assert info["action_is_valid"] and r != pytest.approx(0.0)


@pytest.mark.parametrize("action", [
    "", "   ", "jump", "Upp", "up up", "0", "5", "-1", "1.0", "ＵＰ", "⬆️", "上", "\x00", "Up\u200b", "Right!",
    "<answer>Up</answer>", "x" * 10_000, "".join(chr(0x2600 + i % 200) for i in range(10_000)),
    0, 5, -3, 2.0, True, None, [1], {"a": 1}, object(),
])
def test_malformed_actions_are_invalid_noops(action):
    env = SokobanEnv()
    obs = env.reset(seed=1)
    state = env.get_state()
    out_obs, r, done, info = env.step(action)
    assert out_obs == obs and r == pytest.approx(-0.1) and not done
    assert info["action_is_valid"] is False and info["action_is_effective"] is False and info["success"] is False
    assert env.get_state()[:2] == state[:2] and env.num_env_steps == 1


def test_format_penalty_from_config():
    env = SokobanEnv({"format_penalty": -0.5})
    env.set_room("#######\n#P_X_O#\n#######")
    assert env.step("teleport")[1] == pytest.approx(-0.5)
    assert env.step("Right")[1] == pytest.approx(-0.1)  # the step penalty is separate


def test_several_actions_per_turn():
    env = room("""
#######
#P_X_O#
#######""")
    obs, r, done, info = env.step("Right || right||RIGHT")
    assert done and info["success"] and info["num_actions"] == 3
    assert r == pytest.approx(-0.1 - 0.1 + 10.9)
    env = room("#######\n#P_X_O#\n#######")
    obs, r, done, info = env.step("Right || jump")
    assert not info["action_is_valid"] and info["action_is_effective"]
    assert r == pytest.approx(-0.2) and obs.split("\n")[1] == "#_PX_O#"
    env = SokobanEnv({"max_actions_per_turn": 2})
    env.set_room("#######\n#P___O#\n#_X___#\n#######")
    _, _, _, info = env.step("Right||Right||Right||Right")
    assert info["num_actions"] == 2 and env.num_env_steps == 2
    junk = "||".join(["zz"] * 5000)  # ~10 kB of junk actions: only max_actions_per_turn are run
    _, r, _, info = env.step(junk)
    assert info["num_actions"] == 2 and r == pytest.approx(-0.2) and not info["action_is_valid"]
    assert env.parse_actions("Up||Down||x") == [UP, DOWN]


# ---------------------------------------------------------------- solver
@pytest.mark.parametrize("text,length", [
    ("#######\n#P_X_O#\n#######", 3),
    ("######\n#O_X_#\n#P___#\n######", 6),
    ("#######\n#PXO_O#\n#__X__#\n#_____#\n#######", 7),
    ("#######\n#__O__#\n#__X__#\n#__P__#\n#######", 1),
    ("########\n#P_____#\n#_XX___#\n#_OO___#\n########", 5),
])
def test_solver_optimal_length_on_hand_made_rooms(text, length):
    f, s = text_to_grid(text)
    plan = solve(f, s)
    assert plan is not None and len(plan) == length
    env = room(text)
    assert bfs_length(env) == length
    for a in plan:
        env.step(a)
    assert env.success


def test_solver_unsolvable_solved_and_depth_limit():
    f, s = text_to_grid("#####\n#X_O#\n#P__#\n#####")  # box in a corner
    assert solve(f, s) is None
    f, s = text_to_grid("#####\n#__X#\n#P_O#\n#####")  # box on the wall edge, target off that edge
    assert solve(f, s) is None
    f, s = text_to_grid("#####\n#P√_#\n#####")
    assert solve(f, s) == []
    f, s = text_to_grid("######\n#O_X_#\n#P___#\n######")
    assert solve(f, s, max_depth=5) is None and len(solve(f, s, max_depth=6)) == 6
    # rooms without a wall ring are padded, not rejected
    assert solve(*text_to_grid("P_X_O")) == [RIGHT, RIGHT, RIGHT]


def test_dead_squares():
    f, _ = text_to_grid("######\n#O___#\n#____#\n#____#\n######")
    dead = dead_squares(f)
    expected = {(1, 4), (2, 4), (3, 1), (3, 2), (3, 3), (3, 4)}
    assert {tuple(x) for x in np.argwhere(dead).tolist()} == expected


def test_solver_matches_brute_force_on_random_rooms():
    env = SokobanEnv({"dim_room": (7, 7), "num_boxes": 2})
    for seed in range(6):
        env.reset(seed=seed)
        assert bfs_length(env) == env.optimal_steps == len(env.solve())
    env = SokobanEnv()
    for seed in range(100, 130):
        env.reset(seed=seed)
        assert bfs_length(env) == env.optimal_steps


def test_env_solve_from_current_state_and_copy():
    env = room("######\n#O_X_#\n#P___#\n######")
    clone = env.copy()
    env.step(RIGHT)
    assert len(env.solve()) == 5 and len(clone.solve()) == 6
    assert clone.num_env_steps == 0 and clone.render() != env.render()
    snap = env.get_state()
    env.step(RIGHT)
    env.set_state(snap)
    assert len(env.solve()) == 5
    assert np.array_equal(env.room_state, text_to_grid(env.render())[1])
    assert env.player_position.tolist() == [2, 2]


# ---------------------------------------------------------------- gymnasium wrapper
def test_gymnasium_wrapper_passes_check_env():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from ragen_turn.envs.sokoban import SokobanGymEnv

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(SokobanGymEnv())
        check_env(SokobanGymEnv({"dim_room": (8, 8), "num_boxes": 2}))
        env = gym.make("ragen_turn/Sokoban-v0", render_mode="ansi")
        check_env(env.unwrapped)
    genv = SokobanGymEnv()
    obs, info = genv.reset(seed=11)
    assert obs == SokobanEnv().reset(seed=11) and obs in genv.observation_space
    assert info["optimal_steps"] >= 1
    plan = genv.env.solve()
    for a in plan:
        obs, r, term, trunc, info = genv.step(a)
    assert term and not trunc and isinstance(r, float)
    short = SokobanGymEnv({"max_steps": 2})
    short.reset(seed=0)
    short.step(1)
    _, _, term, trunc, _ = short.step("jump")
    assert trunc and not term


def test_observation_formats_coord_and_grid_coord():
    from ragen_turn.envs.sokoban import SokobanEnv, SokobanEnvConfig

    grid = SokobanEnv(SokobanEnvConfig(search_depth=6))
    coord = SokobanEnv(SokobanEnvConfig(search_depth=6, observation_format="coord"))
    both = SokobanEnv(SokobanEnvConfig(search_depth=6, observation_format="grid_coord"))
    g, c, gc = grid.reset(seed=3), coord.reset(seed=3), both.reset(seed=3)
    rows = g.split("\n")
    p = next((r, row.index(ch)) for r, row in enumerate(rows) for ch in "PS" if ch in row)
    assert c.splitlines()[0] == f"Player: ({p[0]}, {p[1]})"
    assert gc == c + "\nGrid:\n" + g
    for env in (grid, coord, both):
        env.step("Up")
    assert both.render() == coord.render() + "\nGrid:\n" + grid.render()
    with pytest.raises(ValueError, match="observation_format"):
        SokobanEnvConfig(observation_format="pixels")
