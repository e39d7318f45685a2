"""The trajectory trace (``trainer.trace_episodes``, ``engines/trace.py``): what each step records, per turn,
checked against hand cases and against the loss's own statistics, and written by a real local run."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from ragen_turn.algos import get_policy_loss_fn, unit_stats
from ragen_turn.engines.trace import EPISODE_KEYS, TURN_KEYS, check_record, trace_rows, turn_segments
from ragen_turn.runfiles import TRACE_FILE

from helpers import micro_config

REPO = Path(__file__).resolve().parents[1]

CFG = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
# two rows: row 0 has turns of 2 and 2 tokens (a padding gap between), row 1 one turn of 3 tokens
MASK = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]]).float()
TIDS = torch.tensor([[0, 0, -1, -1, 1, 1], [0, 0, 0, -1, -1, -1]])
ADV = torch.tensor([[1.0, 1, 0, 0, -1, -1], [-1, -1, -1, 0, 0, 0]])
OLD = torch.zeros(2, 6)
NEW = torch.tensor([[0.5, 0.5, 0, 0, 0.01, 0.01], [0, -0.3, -0.3, 0, 0, 0]])


def test_unit_stats_hand_case_turn_ppo():
    """turn_ppo: turn (0, 0) has log-ratio 1.0 (> log 1.28) with A > 0: clipped; (0, 1) 0.02: live; row 1's
    turn -0.6 (< log 0.8) with A < 0: clipped."""
    s = unit_stats("turn_ppo", OLD, NEW, ADV, MASK, CFG, turn_ids=TIDS)
    assert s["turn_log_ratio"][0].tolist() == pytest.approx([1.0, 0.02])
    assert s["turn_log_ratio"][1, 0].item() == pytest.approx(-0.6)
    assert s["turn_clipped"][:, 0].tolist() == [1.0, 1.0] and s["turn_clipped"][0, 1] == 0.0
    assert s["turn_live"][0].tolist() == [0.0, 1.0] and s["clip_bias_scale"] is None
    assert s["token_log_ratio"][1].tolist() == pytest.approx([0, -0.3, -0.3, 0, 0, 0])


def test_unit_stats_hand_case_token_ppo_and_turn_is():
    """token_ppo: row 1's tokens 2 and 3 (d = -0.3 < log 0.8, A < 0) are clipped, token 1 is not: 2/3 of the turn;
    the turn's ratio is the geometric mean of the token ratios. turn_is: the turn ratio exp(-0.2) is inside."""
    s = unit_stats("token_ppo", OLD, NEW, ADV, MASK, CFG, turn_ids=TIDS)
    assert s["turn_clipped"][1, 0].item() == pytest.approx(2 / 3)
    assert s["turn_live"][1, 0].item() == pytest.approx(1 / 3)
    assert s["turn_log_ratio"][1, 0].item() == pytest.approx(-0.2)
    t = unit_stats("turn_is", OLD, NEW, ADV, MASK, CFG, turn_ids=TIDS)
    assert t["turn_clipped"][1, 0].item() == 0.0 and t["turn_log_ratio"][1, 0].item() == pytest.approx(-0.2)


@pytest.mark.parametrize("name", ["turn_ppo", "token_ppo", "st_ppo", "turn_is"])
def test_unit_stats_agree_with_the_losss_own_metrics(name):
    """The per-turn shares average to the loss's own clip fractions, and st_ppo's per-row scales to its
    ``actor/clip_bias_scale`` (same units, same code)."""
    torch.manual_seed(0)
    B, T = 6, 12
    mask = (torch.rand(B, T) > 0.2).float()
    mask[:, 0] = 1
    tids = torch.where(mask.bool(), (torch.arange(T) // 4).expand(B, T), torch.full((B, T), -1))
    old, new = torch.randn(B, T) * 0.1, torch.randn(B, T) * 0.3
    adv = torch.randn(B, T)
    _, m = get_policy_loss_fn(name)(old, new, adv, mask, config=CFG, turn_ids=tids)
    s = unit_stats(name, old, new, adv, mask, CFG, turn_ids=tids)
    counts = torch.stack([(tids == h).sum(dim=1) for h in range(3)], dim=1).double()
    present = counts > 0
    assert float(s["turn_clipped"][present].mean()) == pytest.approx(m["actor/clip_frac_turn"])
    tok = float((s["turn_clipped"] * counts).sum() / counts.sum())
    assert tok == pytest.approx(m["actor/clip_frac_token"])
    if name == "st_ppo":
        assert float(s["clip_bias_scale"].mean()) == pytest.approx(m["actor/clip_bias_scale"], rel=1e-5)


def test_trace_rows_keep_groups_whole_and_skip_copies():
    g = [3, 1, 1, 3, 2, 2]
    assert trace_rows(g, 0) == []
    assert trace_rows(g, 2) == [1, 2]  # group 1 whole
    assert trace_rows(g, 3) == [1, 2, 4, 5]  # at least 3: groups 1 and 2, whole
    assert trace_rows(g, 3, keys=["a", "b", "b", "c", "d", "e"]) == [1, 4, 5]  # row 2 is a copy of row 1


def test_turn_segments_cut_a_row_into_observation_and_response():
    ids = [10, 11, 1, 2, 12, 3, 4, 5, 13]
    tids = [-1, -1, 0, 0, -1, 1, 1, 1, -1]
    assert turn_segments(ids, tids) == [{"obs": [10, 11], "resp": [1, 2]}, {"obs": [12], "resp": [3, 4, 5]}]


def run_local(tmp_path, algo="turn_ppo", extra=()):
    from ragen_turn.engines.local.trainer import StarPOTrainer

    cfg = micro_config([f"algo={algo}", "trainer.val_before_train=false", *extra], run_dir=str(tmp_path))
    tr = StarPOTrainer(cfg, log=lambda *a, **k: None)
    tr.fit()
    return tr


def read_lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def check_schema(lines, n_steps, when):
    """The record schema both engines write (``engines.trace.check_record``, docs/usage.md)."""
    assert [x["step"] for x in lines] == list(range(1, n_steps + 1))
    for line in lines:
        check_record(line)
        assert line["update"]["when"] == when
        for ep in line["episodes"]:
            for t in ep["turns"]:
                assert 0.0 <= t["live"] <= 1.0 and 0.0 <= t["clipped"] <= 1.0


def test_check_record_refuses_a_line_missing_a_field():
    line = {"step": 1, "engine": "local", "algo": {}, "update": {"when": "loss"},
            "episodes": [{k: None for k in EPISODE_KEYS} | {"turns": [{k: 0 for k in TURN_KEYS} | {"tokens": []}]}]}
    with pytest.raises(ValueError, match="missing .*log_ratio"):
        check_record(line)
    line["update"]["when"] = None  # no update read (e.g. a critic warm-up step): the update fields may be absent
    check_record(line)


def test_local_run_traces_whole_groups_each_step_and_off_writes_nothing(tmp_path):
    tr = run_local(tmp_path / "on", extra=["trainer.trace_episodes=1"])
    lines = read_lines(tmp_path / "on" / TRACE_FILE)
    check_schema(lines, 2, "loss")
    for line in lines:  # one episode asked for: its group, whole (G = 2)
        eps = line["episodes"]
        assert len(eps) == 2 and len({e["group_id"] for e in eps}) == 1 and [e["ordinal"] for e in eps] == [0, 1]
        for e in eps:
            assert e["reward"] == pytest.approx(sum(t["reward"] for t in e["turns"]), abs=1e-4)
            for t in e["turns"]:  # turn critic: V(s_h) and return_h; turn_ppo: one ratio per turn
                assert t["value"] is not None and t["return"] is not None and "tok_adv" not in t
                assert t["capped"] == (t["n_tokens"] >= 8)
                assert t["log_ratio"] == pytest.approx(sum(t["tok_log_ratio"]), abs=1e-3)
    assert lines[0]["algo"]["policy_loss"] == "turn_ppo" and lines[0]["algo"]["critic_level"] == "turn"
    off = run_local(tmp_path / "off", extra=["trainer.trace_episodes=0"])
    assert off.tracer is None and not (tmp_path / "off" / TRACE_FILE).exists()
    assert tr.tracer is not None


def test_token_critic_records_per_token_values_and_advantages(tmp_path):
    run_local(tmp_path, algo="token_ppo")
    lines = read_lines(tmp_path / TRACE_FILE)
    check_schema(lines, 2, "loss")
    turns = [t for e in lines[-1]["episodes"] for t in e["turns"]]
    assert all(len(t["tok_value"]) == len(t["tok_return"]) == t["n_tokens"] for t in turns)
    assert any("tok_adv" in t for t in turns)  # token GAE: the advantage varies inside a turn
    for t in turns:
        if "tok_adv" in t:
            assert t["adv"] == pytest.approx(sum(t["tok_adv"]) / len(t["tok_adv"]), abs=1e-3)
        assert t["value"] == t["tok_value"][0] and t["return"] == t["tok_return"][0]


def test_trace_episodes_must_be_non_negative():
    from omegaconf import OmegaConf

    from ragen_turn.schema import ConfigError, check_schema

    plain = OmegaConf.create(OmegaConf.to_container(micro_config(), resolve=True))
    assert plain.trainer.trace_episodes == 8  # the default
    plain.trainer.trace_episodes = -1
    with pytest.raises(ConfigError, match="trainer.trace_episodes"):
        check_schema(plain)


def test_numbers_are_finite_or_null(tmp_path):
    run_local(tmp_path, extra=["trainer.trace_episodes=2"])
    text = (tmp_path / TRACE_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text
    for line in read_lines(tmp_path / TRACE_FILE):
        for e in line["episodes"]:
            for t in e["turns"]:
                assert all(x is None or math.isfinite(x) for x in t["tok_log_ratio"])


def test_a_resume_truncates_the_trace_to_its_checkpoint(tmp_path):
    """Like metrics.jsonl: a resumed run drops the lines after its checkpoint's step, then traces on."""
    run_local(tmp_path, extra=["trainer.total_training_steps=1", "trainer.trace_episodes=1"])
    path = tmp_path / TRACE_FILE
    with open(path, "a") as f:  # a step the killed run traced but never checkpointed
        f.write(json.dumps({"step": 2, "engine": "stale", "episodes": []}) + "\n")
    run_local(tmp_path, extra=["trainer.total_training_steps=2", "trainer.trace_episodes=1", "trainer.resume=true"])
    lines = read_lines(path)
    assert [x["step"] for x in lines] == [1, 2] and lines[1]["engine"] == "local"


@pytest.mark.skipif(not os.environ.get("RAGEN_TURN_VERL_RUN"),
                    reason="a real 2-step verl run (Ray, FSDP workers: minutes); .ci/run's verl run checks its trace "
                           "the same way; RAGEN_TURN_VERL_RUN=1 runs it here (wrap in flock /tmp/verl.lock)")
def test_a_real_verl_run_writes_the_local_engines_schema(tmp_path):
    run = tmp_path / "verl"
    subprocess.run(["bash", "train.sh", "sokoban", "turn_ppo", "engine=verl", "trainer.total_training_steps=2",
                    "es_manager.train.env_groups=4", "ppo_mini_batch_size=16", "es_manager.val.env_groups=8",
                    f"trainer.default_local_dir={run}"], cwd=REPO, check=True, timeout=3000)
    lines = read_lines(run / TRACE_FILE)
    check_schema(lines, 2, "after_update")
    assert all(x["engine"] == "verl" for x in lines)
