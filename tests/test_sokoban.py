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
    {"p_change_directions": 1.5}, {"format_penalty": "a lot"}, {"deadlock_penalty": "high"},
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


@pytest.mark.parametrize("penalty", [0.0, -3.0])
def test_deadlock_penalty_paid_once_on_the_push_that_makes_the_room_unsolvable(penalty):
    # the box pushed up against the top wall can never reach the target in the bottom row
    env = SokobanEnv({"deadlock_penalty": penalty})
    env.set_room("######\n#____#\n#_X__#\n#_P_O#\n#____#\n######")
    assert env.step("Up")[1] == pytest.approx(-0.1 + penalty)
    assert env.solve() is None
    env.step("Right")
    env.step("Up")
    assert env.step("Left")[1] == pytest.approx(-0.1)  # pushes the dead box again: paid once only
    # the state snapshot carries whether it was paid: restored to before the push, the push pays again
    env.set_room("######\n#____#\n#_X__#\n#_P_O#\n#____#\n######")
    snap = env.get_state()
    env.step("Up")
    env.set_state(snap)
    assert env.step("Up")[1] == pytest.approx(-0.1 + penalty)
    # a push that leaves the room solvable costs nothing extra
    env.set_room("#######\n#P_X_O#\n#######")
    assert env.step("Right")[1] == pytest.approx(-0.1) and env.step("Right")[1] == pytest.approx(-0.1)


def test_end_on_deadlock_ends_the_episode_at_the_push_that_makes_the_room_unsolvable():
    room_text = "######\n#____#\n#_X__#\n#_P_O#\n#____#\n######"
    env = SokobanEnv({"end_on_deadlock": True})
    env.set_room(room_text)
    assert [env.step(a)[2] for a in ("Left", "Up", "Right")] == [False] * 3  # walks, and a push that leaves the
    assert env.solve() is not None                                           # room solvable, go on
    env.set_room(room_text)
    _, reward, done, info = env.step("Up")  # the box against the top wall: never on the bottom-row target
    assert done and not info["success"] and reward == pytest.approx(-0.1)  # no penalty unless one is set
    assert env.step("Down")[1:3] == (0.0, True)  # over: nothing moves
    env = SokobanEnv({"end_on_deadlock": True, "deadlock_penalty": -2.0})
    env.set_room(room_text)
    assert env.step("Up")[1:3] == (pytest.approx(-2.1), True)
    with pytest.raises(ValueError, match="end_on_deadlock"):
        SokobanEnv({"end_on_deadlock": "yes"})


def test_distance_shaping_pays_the_change_in_the_solvers_moves_left():
    room_text = "######\n#____#\n#_X__#\n#_P_O#\n#____#\n######"
    c = 0.5
    plain, shaped = SokobanEnv(), SokobanEnv({"distance_shaping": c})
    plain.set_room(room_text)
    shaped.set_room(room_text)
    d0 = len(plain.solve())
    assert d0 == 7
    # along an optimal solution every move pays +c on top of gym-sokoban's reward: c * d0 in all
    total_plain = total_shaped = 0.0
    for a in plain.solve():
        rp, rs = plain.step(a)[1], shaped.step(a)[1]
        assert rs - rp == pytest.approx(c)
        total_plain, total_shaped = total_plain + rp, total_shaped + rs
    assert shaped.success and total_shaped - total_plain == pytest.approx(c * d0)
    # a move away from the solution costs c; a step into a wall changes nothing; undoing a step pays it back
    shaped.set_room(room_text)
    assert shaped.step("Down")[1] == pytest.approx(-0.1 - c)   # player (3,2) -> (4,2): 8 moves left
    assert shaped.step("Down")[1] == pytest.approx(-0.1)       # into the wall
    assert shaped.step("Up")[1] == pytest.approx(-0.1 + c)
    # the push that makes the room unsolvable: d jumps to the room's cell count (6 x 6), once
    shaped.set_room(room_text)
    assert shaped.step("Up")[1] == pytest.approx(-0.1 + c * (7 - 36))
    assert shaped.step("Right")[1] == pytest.approx(-0.1)
    # the snapshot carries d: restored to before the push, the push pays the same again
    shaped.set_room(room_text)
    snap = shaped.get_state()
    shaped.step("Left")
    shaped.set_state(snap)
    assert shaped.step("Up")[1] == pytest.approx(-0.1 + c * (7 - 36))


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


def test_observation_formats_coord_and_grid_coord_are_ragens_text():
    """RAGEN's text: board size, then targets (all), boxes off / on target, player (off / on target);
    empty lists are left out; grid_coord puts both under its own headers."""
    text = """
#######
#P_X__#
#_O√__#
#_____#
#######"""
    coord = SokobanEnv({"observation_format": "coord"})
    both = SokobanEnv({"observation_format": "grid_coord"})
    grid = SokobanEnv()
    for env in (coord, both, grid):
        env.set_room(text.strip("\n"), None)
    head = "Board size: 5 rows x 7 cols (zero-indexed).\nTargets: (2, 2), (2, 3)\n"
    for moves, rest in [
        ((), "Boxes: (1, 3)\nBoxes on target: (2, 3)\nPlayer: (1, 1)"),
        ((DOWN, RIGHT), "Boxes: (1, 3)\nBoxes on target: (2, 3)\nPlayer on target: (2, 2)"),  # onto the empty target
        ((RIGHT,), "Boxes: (1, 3), (2, 4)\nPlayer on target: (2, 3)"),  # the box pushed off: no "Boxes on target"
    ]:
        for env in (coord, both, grid):
            for a in moves:
                env.step(a)
        assert coord.render() == head + rest
        assert both.render() == "Coordinates: \n" + head + rest + "\nGrid Map: \n" + grid.render()
    assert "zero-indexed (row, column)" in coord.instruction and "zero-indexed" not in grid.instruction
    with pytest.raises(ValueError, match="observation_format"):
        SokobanEnvConfig(observation_format="pixels")


# ---------------------------------------------------------------- RAGEN's reset rule for boxes on targets
def test_box_on_target_at_reset_is_paid_on_the_first_step():
    """RAGEN starts its boxes-on-target count at 0 at reset: a box already on a target is paid +1 on
    the first step, whatever that step does; later steps compare with the last step's count."""
    env = room("""
#######
#P√_X_#
#___O_#
#######""")
    assert env.boxes_on_target == 0 and not env.done and not env.success
    _, r, done, info = env.step(UP)  # into the wall: nothing moves
    assert r == pytest.approx(0.9) and not done and not info["action_is_effective"]
    assert env.boxes_on_target == 1
    assert env.step(UP)[1] == pytest.approx(-0.1)  # paid once only
    _, r, *_ = env.step(RIGHT)  # push the box off its target
    assert r == pytest.approx(-1.1) and env.boxes_on_target == 0


def test_all_boxes_on_targets_at_reset_end_on_the_first_step():
    env = room("""
######
#P√__#
######""")
    assert not env.done and not env.success  # RAGEN never ends an episode at reset
    obs, r, done, info = env.step(DOWN)
    assert r == pytest.approx(10.9) and done and info["success"]


# ---------------------------------------------------------------- RAGEN's generator
def _ref_ragen_reverse_play(fixed, player, targets, search_depth):
    """Slow reference of RAGEN's reverse play, on 2-D arrays as RAGEN describes it: a recursive
    depth-first search with a time-to-live, one global set of explored room states (boxes never
    pulled are marked 4, pulled ones 3), moves up/down/left/right in that order, each pulling a box
    that stands behind the player; score = (changes of the pulled box) * (boxes' Manhattan distance
    from their own targets), 0 while a box or the player covers a target; the first best state wins."""
    import sys
    grid_fixed = fixed
    state = grid_fixed.copy()
    for t in targets:
        state[t] = 4
    state[player] = 5
    explored = set()
    best = {"score": -1, "state": None}
    n_targets = len(targets)
    changes = [(-1, 0), (1, 0), (0, -1), (0, 1)]

    def dfs(st, mapping, swaps, last, ttl):
        ttl -= 1
        if ttl <= 0 or len(explored) >= 300_000:
            return
        h = st.tobytes()
        if h in explored:
            return
        score = swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t, b in mapping.items())
        if int((st == 2).sum()) != n_targets:
            score = 0
        if score > best["score"]:
            best.update(score=score, state=st.copy())
        explored.add(h)
        for dr, dc in changes:
            nxt, m2, last2 = st.copy(), dict(mapping), last
            pr, pc = map(int, np.argwhere(nxt == 5)[0])
            qr, qc = pr + dr, pc + dc
            if nxt[qr, qc] in (1, 2):
                nxt[qr, qc], nxt[pr, pc] = 5, grid_fixed[pr, pc]
                br, bc = pr - dr, pc - dc
                if nxt[br, bc] in (3, 4):
                    nxt[pr, pc], nxt[br, bc] = 3, grid_fixed[br, bc]
                    for k in m2:
                        if m2[k] == (br, bc):
                            m2[k], last2 = (pr, pc), k
            dfs(nxt, m2, swaps + (last2 != last), last2, ttl)

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * search_depth + 100))
    try:
        dfs(state, {t: t for t in targets}, 0, (-1, -1), search_depth)
    finally:
        sys.setrecursionlimit(old)
    st = best["state"]
    boxes = sorted(map(tuple, np.argwhere((st == 3) | (st == 4)).tolist()))
    return best["score"], tuple(map(int, np.argwhere(st == 5)[0])), boxes


@pytest.mark.parametrize("dims,nb,depth", [((6, 6), 1, 300), ((8, 8), 2, 10), ((7, 7), 2, 25)])
def test_reverse_play_matches_a_slow_reference_of_ragens(dims, nb, depth):
    from ragen_turn.envs.sokoban.generation import _reverse_play, _Stream, _topology

    rows, cols = dims
    rng = random.Random(depth)
    checked = 0
    for seed in range(60):
        fixed = _topology(rows, cols, int(1.7 * (rows + cols)), 0.35, _Stream(seed))
        cells = [i for i in range(rows * cols) if fixed[i]]
        if len(cells) <= nb + 1:
            continue
        picks = rng.sample(cells, nb + 1)
        player, targets = picks[0], tuple(picks[1:])
        for t in targets:
            fixed[t] = 2
        score, p, boxes, _, solution = _reverse_play(rows, cols, fixed, player, targets, depth)
        arr = np.frombuffer(bytes(fixed), dtype=np.uint8).astype(np.int64).reshape(rows, cols)
        rc = lambda i: divmod(i, cols)  # noqa: E731
        ref_score, ref_p, ref_boxes = _ref_ragen_reverse_play(arr, rc(player), [rc(t) for t in targets], depth)
        assert max(score, 0) == max(ref_score, 0), f"seed {seed}"
        if score > 0:
            assert rc(p) == ref_p and sorted(rc(b) for b in boxes) == ref_boxes, f"seed {seed}"
            env = SokobanEnv({"dim_room": dims, "num_boxes": nb})
            state = arr.copy()
            for b in boxes:
                state[rc(b)] = 4
            state[rc(p)] = 5
            env.set_room(arr, state)
            for a in solution:  # the path back solves the room
                env.step(a)
            assert env.success
            checked += 1
    assert checked >= 20


# RAGEN's own generator (mll-lab-nu/RAGEN 2026-04, ragen/env/sokoban/utils.py generate_room, seeded as its
# SokobanEnv.reset), rooms solved with our solver: mean optimal solution length over 4,000 rooms at 6x6 / 1 box
# (search_depth 300, RAGEN's default) and at 8x8 / 2 boxes (search_depth 10, RAGEN's LargerSokoban);
# benchmarks/sokoban_difficulty.py, docs/sokoban.md.
RAGEN_MEAN_OPTIMAL = {((6, 6), 1, 300): 4.073, ((8, 8), 2, 10): 5.798}


@pytest.mark.parametrize("key", sorted(RAGEN_MEAN_OPTIMAL))
def test_room_difficulty_within_10_percent_of_ragens(key):
    dims, nb, depth = key
    env = SokobanEnv({"dim_room": dims, "num_boxes": nb, "search_depth": depth})
    lengths = []
    for seed in range(400):
        env.reset(seed=seed)
        lengths.append(env.optimal_steps)
    mean = float(np.mean(lengths))
    assert abs(mean / RAGEN_MEAN_OPTIMAL[key] - 1) < 0.10, mean


def test_pass_at_k_of_the_failures_benchmark_is_the_chance_that_k_tries_hold_a_success():
    import importlib.util
    import itertools
    import math
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sokoban_failures.py"
    spec = importlib.util.spec_from_file_location("sokoban_failures", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # hand cases: one success in 4 tries
    assert bench.pass_at_k([4], [1], 1) == pytest.approx(0.25)
    assert bench.pass_at_k([4], [1], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert bench.pass_at_k([4], [1], 4) == 1.0 and bench.pass_at_k([4], [0], 4) == 0.0
    # a slow reference: every k-subset of each room's tries, averaged over rooms
    rooms = [[1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]]
    for k in range(1, 6):
        slow = sum(sum(any(s) for s in itertools.combinations(r, k)) / math.comb(len(r), k) for r in rooms) / len(rooms)
        assert bench.pass_at_k([len(r) for r in rooms], [sum(r) for r in rooms], k) == pytest.approx(slow)
