"""The local engine end to end on CPU with a micro model: every algo, invariants, resume, errors."""
from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import open_dict

from ragen_turn.config import validate_config
from ragen_turn.engines.local.trainer import StarPOTrainer, build_trainer, warmup_lr_factor
from ragen_turn.warmstart import collect_demonstrations

from helpers import TEST_DEVICE, micro_config, resume_vs_uninterrupted

ALGOS = ["grpo", "token_ppo", "bi_level_gae", "s_ppo", "turn_ppo", "turn_ppo_geo", "turn_is", "st_ppo", "so_ppo",
         "so_grpo"]


def _quiet(*a, **k):
    pass


def mixed_policy(tok):
    """Solver answers and junk alternately: rewards differ within every group."""
    import itertools

    from ragen_turn.rollout import TextPolicy

    flip = itertools.cycle([0, 1])

    def respond(slot):
        if next(flip):
            return "no idea"
        return "<answer>" + slot.env.ACTION_LOOKUP[slot.env.solve()[0]] + "</answer>"

    return TextPolicy(tok, respond)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_runs_two_steps(algo, tmp_path):
    cfg = micro_config([f"algo={algo}"], run_dir=tmp_path)
    trainer = build_trainer(cfg, log=_quiet)
    assert type(trainer) is StarPOTrainer  # one trainer; the critic follows the estimator
    assert (trainer.critic is None) == (cfg.critic.level == "none")
    trainer.sampler = mixed_policy(trainer.tokenizer)  # reward variance even for an untrained model
    before = [p.detach().clone() for p in trainer.actor.parameters()]
    last = trainer.fit()
    assert last["step"] == 2
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [0, 1, 2]
    for key in ("env/reward", "env/success", "actor/clip_frac_token", "actor/clip_frac_turn", "actor/approx_kl",
                "adv/mean", "response_length/capped_turn_frac", "actor/token_outside_frac", "perf/tokens_per_s",
                "perf/step_s", "val/success"):
        assert key in lines[-1], key
    assert math.isfinite(lines[-1]["actor/pg_loss"])
    if cfg.critic.level != "none":
        assert math.isfinite(lines[-1]["critic/value_loss"])
    after = list(trainer.actor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the actor did not change"
    assert (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "checkpoints" / "latest").is_file()


def test_turn_critic_reads_values_at_turn_starts(tmp_path):
    cfg = micro_config(["algo=turn_ppo"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    turn_values, _, mask = tr.value_targets(batch)  # the turn critic's targets: V(s_h) and return_h [B, H]
    assert turn_values.shape == mask.shape == batch.turn_mask.shape
    # V(s_h) must be the critic's output at the last token of s_h (one before the turn's first token)
    raw = tr._forward_all(lambda ids, am, pos, rm: tr.critic(ids, am, pos), batch)
    for b in range(batch.batch_size):
        starts = [t for t in range(batch.input_ids.shape[1]) if batch.response_mask[b, t] == 1 and
                  (t == 0 or batch.response_mask[b, t - 1] == 0)]
        for h, t in enumerate(starts):
            assert turn_values[b, h].item() == pytest.approx(raw[b, t - 1].item(), abs=1e-6)


def test_scoring_in_length_sorted_micro_batches_keeps_each_rows_numbers(tmp_path):
    """``_forward_all`` runs rows of similar length together; its rows come back in the batch's order, equal to a
    forward of each row alone on its real tokens."""
    cfg = micro_config(["algo=turn_ppo", "micro_batch_size_per_gpu=3"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    batch = collect_demonstrations(cfg, tr.tokenizer, 8, seed=3)  # solver episodes: 1 to 5 turns
    lengths = batch.attention_mask.sum(dim=1)
    assert lengths.unique().numel() > 1 and not torch.equal(torch.argsort(lengths, stable=True),
                                                             torch.arange(batch.batch_size))
    logp = tr._forward_all(lambda *a: tr.logprobs(tr.actor, *a), batch)
    values = tr._forward_all(lambda ids, am, pos, rm: tr.critic(ids, am, pos), batch)
    assert logp.shape == values.shape == batch.input_ids.shape
    for b in range(batch.batch_size):
        row = batch.select([b])
        n = int(lengths[b])
        with torch.no_grad():
            alone = tr.logprobs(tr.actor, row.input_ids, row.attention_mask, row.position_ids, row.response_mask)
            v_alone = tr.critic(row.input_ids, row.attention_mask, row.position_ids)
        torch.testing.assert_close(logp[b, :n], alone[0].float(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values[b, :n], v_alone[0].float(), rtol=1e-4, atol=1e-5)
        assert not logp[b, n:].any()


def _same_scores_and_gradients_with_and_without(tr, batch, flag):
    """Score ``batch`` and take the actor's and critic's mini-batch gradients with ``engine.<flag>`` off, then on:
    the same old log-probs and values (1e-6), loss statistics (1e-5 relative) and gradients (1e-4 relative), non-zero;
    returns the two scored batches (off, on)."""
    from omegaconf import open_dict

    seen = {}
    for on in (False, True):
        with open_dict(tr.cfg):
            tr.cfg.engine[flag] = on
        b = batch.select(torch.arange(batch.batch_size))
        tr.score(b)
        tr.compute_advantages(b)
        grads = {}
        for name, model, loss_of in (("actor", tr.actor, tr.actor_loss), ("critic", tr.critic, tr.critic_step_loss)):
            grads[name] = _mini_batch_grads(tr, model, loss_of, None, b, 3)
        seen[on] = (b, grads)
    (b0, g0), (b1, g1) = seen[False], seen[True]
    torch.testing.assert_close(b1.old_logp, b0.old_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(b1.values, b0.values, rtol=0, atol=1e-6)
    for name in ("actor", "critic"):
        (m0, grads0), (m1, grads1) = g0[name], g1[name]
        assert m0.keys() == m1.keys() and all(m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7) for k in m0)
        assert any(g.abs().sum() > 0 for g in grads0)
        for x, y in zip(grads1, grads0):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6 * max(float(y.abs().max()), 1e-12))
    return b0, b1


def test_causal_attention_without_the_padding_mask_keeps_scores_and_gradients(tmp_path):
    """``engine.causal_attention``: right-padded rows run plain causal attention (no padding mask). The old
    log-probs and values equal the masked forward's, and one mini-batch's accumulated gradients (actor and critic,
    rows of uneven lengths in micro-batches) agree to float rounding; a left-padded batch keeps its mask."""
    from ragen_turn.models.logprobs import model_mask

    cfg = micro_config(["algo=turn_ppo", "es_manager.train.env_groups=4", "es_manager.train.group_size=2",
                        "agent_proxy.max_turn=3", "ppo_mini_batch_size=8", "micro_batch_size_per_gpu=3",
                        "model.num_attention_heads=4", "model.num_key_value_heads=2"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = uneven_policy(tr.tokenizer)
    batch = tr.rollout(0)
    assert batch.attention_mask.sum(1).unique().numel() > 2  # rows of uneven lengths: padding in the micro-batches
    _same_scores_and_gradients_with_and_without(tr, batch, "causal_attention")
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert model_mask(right, True) is None and model_mask(right, False) is right
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert model_mask(left, True) is left
    # the padding's position ids go on counting, so that transformers builds no [B, 1, T, T] packed-sequence mask
    from transformers.masking_utils import create_causal_mask
    from ragen_turn.models.logprobs import model_inputs, positions_from_mask

    pos = positions_from_mask(right)
    mask, run_pos = model_inputs(right, pos, True)
    assert mask is None and torch.equal(run_pos, torch.arange(4).expand(2, 4)) and torch.equal(run_pos[1], pos[1])
    embeds = torch.zeros(2, 4, tr.actor.config.hidden_size)
    args = dict(config=tr.actor.config, inputs_embeds=embeds, attention_mask=None, past_key_values=None)
    assert create_causal_mask(position_ids=run_pos, **args) is None
    assert create_causal_mask(position_ids=pos, **args) is not None  # what the repeated last position gave
    assert model_inputs(left, positions_from_mask(left), True)[0] is left


@pytest.mark.parametrize("arch,layers,causal", [("qwen2", 2, True), ("qwen2", 1, False), ("llama", 2, True)])
def test_last_layer_where_read_keeps_scores_and_gradients(arch, layers, causal, tmp_path):
    """``engine.last_layer_where_read``: the last layer runs only at the positions whose output is read
    (models/last_layer.py). Against every position (the old path), on one batch of uneven rows: the old log-probs,
    the critic's values (a non-zero head) and the bootstrap values within 1e-6, and one mini-batch's accumulated
    actor and critic gradients (micro-batches of 3) and metrics to float rounding; the path is taken."""
    from ragen_turn.models import last_layer
    from ragen_turn.models.logprobs import base_model

    cfg = micro_config(["algo=turn_ppo", "es_manager.train.env_groups=4", "es_manager.train.group_size=2",
                        "agent_proxy.max_turn=3", "ppo_mini_batch_size=8", "micro_batch_size_per_gpu=3",
                        f"model.arch={arch}", f"model.num_hidden_layers={layers}", "model.num_attention_heads=4",
                        "model.num_key_value_heads=2", f"engine.causal_attention={causal}",
                        "algorithm.bootstrap_truncated=true"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    assert last_layer.last_layer_supported(base_model(tr.actor)) and last_layer.last_layer_supported(tr.critic.backbone)
    with torch.no_grad():
        tr.critic.value_head.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    tr.sampler = uneven_policy(tr.tokenizer)
    batch = tr.rollout(0)
    assert batch.attention_mask.sum(1).unique().numel() > 2
    calls = []
    real = last_layer.hidden_where_read

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    b0, b1 = _same_scores_and_gradients_with_and_without(tr, batch, "last_layer_where_read")
    assert b0.values.abs().max() > 1e-3 and b0.bootstrap_values is not None
    torch.testing.assert_close(b1.bootstrap_values, b0.bootstrap_values, rtol=0, atol=1e-6)
    import ragen_turn.models.logprobs as lp_mod
    import ragen_turn.models.value_head as vh_mod
    for mod in (lp_mod, vh_mod):  # the new path is the one that ran
        mod.hidden_where_read = spy
    try:
        tr.score(batch.select(torch.arange(batch.batch_size)))
    finally:
        for mod in (lp_mod, vh_mod):
            mod.hidden_where_read = real
    assert len(calls) == 2 * len(tr._micro_batches(batch))  # old log-probs and values, each micro-batch


def test_hidden_where_read_is_the_models_hidden_state_there():
    """``hidden_where_read`` on left-padded rows with the padding mask, and on right-padded rows without one:
    the body's last hidden state at the read positions, in row-major order, to float rounding; nothing read in
    a row (and nothing at all) is fine."""
    from ragen_turn.models.last_layer import hidden_where_read
    from ragen_turn.models.logprobs import base_model, positions_from_mask

    tr = build_trainer(micro_config(["model.num_attention_heads=4", "model.num_key_value_heads=2",
                                     "model.num_hidden_layers=2"]), log=_quiet)
    base = base_model(tr.actor)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, len(tr.tokenizer), (3, 9), generator=g)
    left = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9, [0] * 5 + [1] * 4])
    right = left.flip(1)
    read = torch.rand(3, 9, generator=g) > 0.6
    read[2] = False
    with torch.no_grad():
        for am, mask in ((left, left), (right, None)):
            pos = positions_from_mask(am)
            full = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
            r = read & am.bool()
            got = hidden_where_read(base, ids, mask, pos, r)
            assert got.shape == (int(r.sum()), full.shape[-1])
            torch.testing.assert_close(got, full[r], rtol=1e-5, atol=1e-5)
            assert hidden_where_read(base, ids, mask, pos, torch.zeros_like(r)).shape == (0, full.shape[-1])


def test_turn_ppo_one_turn_takes_the_sequence_level_update(tmp_path):
    # the papers' trust region (turn-mean, no token band): one turn per episode is sequence-level PPO
    cfg = micro_config(["algo=turn_ppo", "agent_proxy.max_turn=1", "ppo_mini_batch_size=4",
                        "micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.policy_loss.loss_agg_mode=turn-mean",
                        "actor_rollout_ref.actor.policy_loss.token_band=false"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = mixed_policy(tr.tokenizer)
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    # perturb the policy so ratios differ from 1 (some clipped, some not)
    with torch.no_grad():
        for p in tr.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, _ = tr.actor_loss(batch.to(tr.device))
    grads = torch.autograd.grad(loss, list(tr.actor.parameters()))
    # sequence-level PPO by hand: one ratio per episode = prod of token ratios, one advantage per episode
    from ragen_turn.models import sequence_logprobs
    dev = tr.device
    logp = sequence_logprobs(tr.actor, batch.input_ids.to(dev), batch.attention_mask.to(dev),
                             batch.position_ids.to(dev))
    m = batch.response_mask.to(dev)
    seq_ratio = torch.exp(((logp - batch.old_logp.to(dev)) * m).sum(1))
    seq_adv = (batch.advantages.to(dev) * m).sum(1) / m.sum(1)
    low, high = cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high
    seq_loss = (-torch.minimum(seq_ratio * seq_adv, seq_ratio.clamp(1 - low, 1 + high) * seq_adv)).mean()
    seq_grads = torch.autograd.grad(seq_loss, list(tr.actor.parameters()))
    assert loss.item() == pytest.approx(seq_loss.item(), rel=1e-5, abs=1e-7)
    for g1, g2 in zip(grads, seq_grads):
        assert torch.allclose(g1, g2, atol=1e-6)


def uneven_policy(tok):
    """Per episode: the whole solution in one turn (a one-turn episode), junk, or rambling of a length that
    grows with the episode's index (turn limit): uneven turn counts and turn lengths."""
    from ragen_turn.rollout import TextPolicy

    index = {}

    def respond(slot):
        i = index.setdefault(id(slot), len(index))
        if i % 3 == 0:
            return "<answer>" + " || ".join(slot.env.ACTION_LOOKUP[a] for a in slot.env.solve()[:5]) + "</answer>"
        return "no idea" if i % 3 == 1 else "hmm " * (1 + i)

    return TextPolicy(tok, respond)


def _mini_batch_grads(tr, model, loss_of, stats_of, batch, micro):
    with open_dict(tr.cfg):
        tr.cfg.micro_batch_size_per_gpu = micro
    model.train()
    model.zero_grad(set_to_none=True)
    metrics = tr._accumulate(batch, loss_of, stats_of)
    return metrics, [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


@pytest.mark.parametrize("algo", ALGOS)
def test_micro_batch_size_does_not_change_the_update(algo, tmp_path):
    """One mini-batch of 8 episodes with uneven turn counts and lengths: micro-batches of 8 (= mini), 2 (= mini/4)
    and 3 (uneven) give the same losses, the same accumulated gradients, actor (policy loss + entropy + KL, the
    correction's statistic included) and critic, and the same logged statistics (every one of them: approx KL,
    clip fractions, live share, the correction's ratio...), to 1e-6 relative."""
    cfg = micro_config([f"algo={algo}", "es_manager.train.env_groups=4", "es_manager.train.group_size=2",
                        "agent_proxy.max_turn=3", "ppo_mini_batch_size=8", "micro_batch_size_per_gpu=8",
                        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
                        "actor_rollout_ref.rollout.response_length=12",
                        # so_*: a threshold the mini-batch statistic passes here, so it does scale the loss
                        *(["actor_rollout_ref.actor.policy_loss.clip_bias_threshold=1.0"] if algo.startswith("so_")
                          else [])], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = uneven_policy(tr.tokenizer)
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    turns, tokens = batch.turn_mask.sum(dim=1), batch.response_mask.sum(dim=1)
    assert len(set(turns.tolist())) > 1 and len(set(tokens.tolist())) > 2  # uneven rows
    torch.manual_seed(1)
    with torch.no_grad():  # ratios away from 1: clipping, dual clip and the correction are active
        for p in tr.actor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    a = cfg.actor_rollout_ref.actor
    stats_of = tr.clip_stats if algos_needs_stats(a.policy_loss.loss_mode, tr.loss_cfg) else None
    runs = [(tr.actor, tr.actor_loss, stats_of, ("actor/pg_loss", "actor/entropy", "actor/kl_loss"))]
    if tr.critic is not None:
        runs.append((tr.critic, tr.critic_step_loss, None, ("critic/value_loss",)))
    actor_metrics = None
    for model, loss_of, stats, keys in runs:
        m_full, g_full = _mini_batch_grads(tr, model, loss_of, stats, batch, 8)
        actor_metrics = actor_metrics or m_full
        for micro in (2, 3):
            m_micro, g_micro = _mini_batch_grads(tr, model, loss_of, stats, batch, micro)
            for k in keys:
                assert m_micro[k] == pytest.approx(m_full[k], rel=1e-5, abs=1e-7), (algo, k)
            assert set(m_micro) == set(m_full)
            for k, v in m_full.items():  # every logged statistic is the mini-batch's
                assert m_micro[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (algo, micro, k)
            for g1, g2 in zip(g_full, g_micro):
                assert torch.allclose(g1, g2, rtol=1e-4, atol=1e-7), algo
        assert any(g.abs().sum() > 0 for g in g_full)
    if stats_of is not None:
        assert actor_metrics["actor/clip_bias_scale"] < 1.0, actor_metrics  # the mini-batch statistic scaled the loss


@pytest.mark.parametrize("algo", ["turn_ppo", "token_ppo"])
def test_bootstrap_truncated_reads_the_value_after_the_last_token(algo, tmp_path):
    """Episodes cut by the turn limit bootstrap from the critic's value after their last token; finished ones
    (the solver's one-turn episodes) do not; the advantages are the GAE with those last values."""
    from ragen_turn.algos import get_adv_estimator_fn
    from ragen_turn.engines.advantages import critic_targets, normalized_turn_rewards

    runs = {}
    for boot in (False, True):
        cfg = micro_config([f"algo={algo}", "es_manager.train.env_groups=3", "ppo_mini_batch_size=6",
                            f"algorithm.bootstrap_truncated={str(boot).lower()}"], run_dir=tmp_path / str(boot))
        tr = build_trainer(cfg, log=_quiet)
        tr.sampler = uneven_policy(tr.tokenizer)
        torch.manual_seed(0)
        with torch.no_grad():  # a value head that says something (it starts at 0)
            for p in tr.critic.value_head.parameters():
                p.add_(torch.randn_like(p))
        batch = tr.rollout(0)
        tr.score(batch)
        tr.compute_advantages(batch)
        runs[boot] = (tr, batch)
    tr, batch = runs[True]
    truncated = torch.tensor([e.truncated for e in batch.episodes])
    finished = torch.tensor([e.success for e in batch.episodes])
    assert truncated.any() and finished.any() and not (truncated & finished).any()
    dev = tr.device
    after = tr.critic(batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.position_ids.to(dev)).cpu()
    for b in range(batch.batch_size):
        expect = after[b, int(batch.attention_mask[b].sum()) - 1].item() if truncated[b] else 0.0
        assert batch.bootstrap_values[b].item() == pytest.approx(expect, rel=1e-6, abs=1e-6)  # float rounding
    adv, _ = get_adv_estimator_fn(cfg.algorithm.adv_estimator)(
        turn_rewards=normalized_turn_rewards(batch, cfg), turn_mask=batch.turn_mask, turn_ids=batch.turn_ids,
        response_mask=batch.response_mask, group_ids=batch.group_ids, values=batch.values, config=cfg.algorithm,
        bootstrap_values=batch.bootstrap_values)
    assert torch.allclose(batch.advantages, adv)
    off = runs[False][1]
    assert off.bootstrap_values is None
    targets = {k: critic_targets(x, cfg.critic.level)[2] for k, x in (("off", off), ("on", batch))}
    assert not torch.allclose(targets["off"], targets["on"])  # the bootstrap changed truncated rows' targets
    rows_equal = [torch.allclose(targets["off"][b], targets["on"][b]) for b in range(batch.batch_size)]
    assert all(eq for eq, t in zip(rows_equal, truncated.tolist()) if not t)  # finished rows keep their returns


@pytest.mark.parametrize("algo", ["turn_ppo", "so_ppo"])
def test_runs_differing_only_in_micro_batch_size_write_the_same_checkpoint(algo, tmp_path):
    """One training step with micro-batches of 4 (= the mini-batch) and of 1: the same first checkpoint."""
    from safetensors.torch import load_file

    ckpts = {}
    for micro in (4, 1):
        cfg = micro_config([f"algo={algo}", "ppo_mini_batch_size=4", f"micro_batch_size_per_gpu={micro}",
                            "agent_proxy.max_turn=3", "trainer.total_training_steps=1",
                            "actor_rollout_ref.actor.optim.lr=1e-3", "critic.optim.lr=1e-3"],
                           run_dir=tmp_path / str(micro))
        tr = build_trainer(cfg, log=_quiet)
        tr.sampler = uneven_policy(tr.tokenizer)
        tr.fit()
        step = tmp_path / str(micro) / "checkpoints" / "step_000001"
        ckpts[micro] = {part: load_file(next((step / part).glob("*.safetensors"))) for part in ("actor", "critic")}
    for part in ("actor", "critic"):
        a, b = ckpts[4][part], ckpts[1][part]
        assert a.keys() == b.keys()
        for k in a:
            # AdamW's first step moves each weight by about lr x sign(g): where g is ~0 its float noise can flip the
            # sign, so the tolerance is a small fraction of lr (a wrong micro-batch weighting moves weights by ~lr)
            assert torch.allclose(a[k], b[k], rtol=0, atol=0.05 * 1e-3), (part, k, float((a[k] - b[k]).abs().max()))


@pytest.mark.parametrize("algo", ["turn_ppo", "token_ppo"])
def test_explained_variance_is_the_batchs_for_any_micro_batch_size(algo, tmp_path):
    """``critic/explained_var`` is 1 - Var[R - V] / Var[R] over the whole batch (the critic before the step's update,
    in its own layout: turns for turn_ppo), not a mean over micro-batches, whose rows (length-sorted) have like
    returns."""
    from ragen_turn.algos import explained_variance

    ev = {}
    for micro in (8, 1):
        cfg = micro_config([f"algo={algo}", "es_manager.train.env_groups=4", "es_manager.train.group_size=2",
                            "agent_proxy.max_turn=3", "ppo_mini_batch_size=8", f"micro_batch_size_per_gpu={micro}",
                            "trainer.total_training_steps=1"], run_dir=tmp_path / str(micro))
        tr = build_trainer(cfg, log=_quiet)
        tr.sampler = uneven_policy(tr.tokenizer)
        torch.manual_seed(0)
        with torch.no_grad():  # a critic that predicts something (its value head starts at zero)
            for p in tr.critic.parameters():
                p.add_(0.3 * torch.randn_like(p))
        batch = tr.rollout(0)
        tr.score(batch)
        tr.compute_advantages(batch)
        expected = explained_variance(*tr.value_targets(batch))
        tr.fit()
        rows = [json.loads(line) for line in (tmp_path / str(micro) / "metrics.jsonl").open()]
        ev[micro] = next(r["critic/explained_var"] for r in rows if "critic/value_loss" in r)
        assert ev[micro] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert math.isfinite(ev[8]) and ev[8] != 0.0 and ev[1] == pytest.approx(ev[8], rel=1e-5), ev


def algos_needs_stats(name, loss_cfg):
    from ragen_turn.algos import needs_minibatch_stats

    return needs_minibatch_stats(name, loss_cfg)


# CPU runs repeat to the last bits; CUDA kernels (atomics, split reductions) differ in the last bits between runs
RESUME_RTOL, RESUME_ATOL = (1e-6, 1e-7) if TEST_DEVICE == "cpu" else (1e-4, 1e-5)


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    common = ["algo=turn_ppo", "trainer.save_freq=1", "trainer.total_training_steps=3"]
    # "killed" after step 2: a run that stops there, then a fresh process resumes it
    full, resumed, a, b = resume_vs_uninterrupted(tmp_path, common, stop_at=2)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a, b):
        for k in ra:
            if k.startswith("perf/"):
                continue
            assert ra[k] == pytest.approx(rb[k], rel=RESUME_RTOL, abs=RESUME_ATOL), (ra["step"], k)
    for p1, p2 in zip(full.actor.parameters(), resumed.actor.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6)


def test_log_val_generations_writes_held_out_episodes_and_resume_truncates_them(tmp_path):
    """trainer.log_val_generations=N: every held-out eval appends its first N episodes, decoded, to
    val_generations.jsonl with their step, seed, reward and success; a resume keeps the lines up to its step."""
    common = ["algo=grpo", "trainer.log_val_generations=2", "trainer.test_freq=1", "trainer.save_freq=1",
              "trainer.total_training_steps=2"]
    tr = build_trainer(micro_config(common, run_dir=tmp_path), log=_quiet)
    tr.fit()
    path = tmp_path / "val_generations.jsonl"
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 1, 1, 2, 2]
    for r in rows:
        assert set(r) == {"step", "tag", "env_seed", "reward", "success", "text"}
        assert r["text"].count("<|im_start|>assistant") >= 1 and "Turn 1" in r["text"]
        assert r["tag"] in tr.cfg.es_manager.val.env_configs.tags
    assert [r["env_seed"] for r in rows[:2]] == [r["env_seed"] for r in rows[2:4]]  # the same held-out seeds
    assert all(m["val/reward"] is not None for m in metrics)
    # resumed from step 1: the step-2 lines go, and the run writes them again
    resumed = build_trainer(micro_config(common + ["trainer.resume=true", "trainer.resume_from=step_000001"],
                                         run_dir=tmp_path), log=_quiet)
    assert resumed.step == 1 and [json.loads(l)["step"] for l in path.read_text().splitlines()] == [0, 0, 1, 1]
    resumed.fit()
    assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [0, 0, 1, 1, 2, 2]


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    grads = {}
    for gc in (False, True):
        torch.manual_seed(0)
        tr = build_trainer(micro_config(["algo=turn_ppo", f"engine.gradient_checkpointing={str(gc).lower()}"],
                                        run_dir=tmp_path / str(gc)), log=_quiet)
        assert tr.actor.is_gradient_checkpointing == gc and tr.critic.backbone.is_gradient_checkpointing == gc
        batch = tr.rollout(0)
        tr.score(batch)
        tr.compute_advantages(batch)
        tr.actor.train()
        calls = []
        mlp = tr.actor.model.layers[0].mlp
        mlp_forward = mlp.forward
        mlp.forward = lambda *args, **kw: (calls.append(1), mlp_forward(*args, **kw))[1]
        loss, _ = tr.actor_loss(batch.to(tr.device))
        n_forward = len(calls)
        grads[gc] = torch.autograd.grad(loss, list(tr.actor.parameters()))
        assert len(calls) == (2 * n_forward if gc else n_forward)  # checkpointing re-runs the layer in backward
    for g1, g2 in zip(grads[False], grads[True]):
        assert torch.allclose(g1, g2, atol=1e-6)


def test_time_budget_ends_the_run_with_an_evaluated_checkpoint(tmp_path):
    common = ["algo=turn_ppo", "trainer.test_freq=0", "trainer.save_freq=0", "trainer.total_training_steps=4"]
    # a budget spent by the first step: that step becomes the final one (held-out eval + checkpoint)
    tr = build_trainer(micro_config(common + ["trainer.time_budget_s=1e-6"], run_dir=tmp_path), log=_quiet)
    tr.fit()
    assert tr.step == 1
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "val/success" in rows[-1]
    assert (tmp_path / "checkpoints" / "step_000001").is_dir()
    # the steps left run on resume
    resumed = build_trainer(micro_config(common + ["trainer.resume=true"], run_dir=tmp_path), log=_quiet)
    assert resumed.step == 1
    resumed.fit()
    assert resumed.step == 4


@pytest.mark.parametrize("steps,ratio,total,want", [
    (4, 0.0, 60, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]),  # n steps: index / n, the first update at lr 0
    (-1, 0.1, 20, [0.0, 0.5, 1.0, 1.0]),             # -1: int(0.1 x 20) = 2 steps
    (0, 0.25, 10, [0.0, 0.5, 1.0]),                  # 0 delegates to the ratio too (verl): int(2.5) = 2
    (-1, 0.0, 60, [1.0, 1.0]),                       # the default: no warm-up
    (1, 0.0, 60, [0.0, 1.0, 1.0]),
])
def test_warmup_lr_factor_is_verls_constant_schedule_with_warmup(steps, ratio, total, want):
    cfg = {"lr_warmup_steps": steps, "lr_warmup_steps_ratio": ratio}
    assert [warmup_lr_factor(cfg, i, total) for i in range(len(want))] == pytest.approx(want)


def test_lr_warmup_scales_every_param_group_per_step_and_resumes_exactly(tmp_path):
    """actor / critic ``optim.lr_warmup_steps=2``: the first update has lr 0 (weights unchanged), the second half
    the config lr, then the config lr; each group keeps its own base (a shared critic's head has the critic's lr).
    A run stopped after step 1 and resumed trains as one that never stopped."""
    common = ["algo=turn_ppo", "trainer.save_freq=1", "trainer.test_freq=0", "trainer.total_training_steps=3",
              "actor_rollout_ref.actor.optim.lr_warmup_steps=2", "critic.optim.lr_warmup_steps=2"]
    full = build_trainer(micro_config(common, run_dir=tmp_path / "full"), log=_quiet)
    a_lr, c_lr = full.cfg.actor_rollout_ref.actor.optim.lr, full.cfg.critic.optim.lr
    before = [p.detach().clone() for p in full.actor.parameters()]
    full.fit()
    rows = [json.loads(l) for l in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["actor/lr"] for r in rows] == pytest.approx([0.0, a_lr / 2, a_lr])
    assert [r["critic/lr"] for r in rows] == pytest.approx([0.0, c_lr / 2, c_lr])

    one = build_trainer(micro_config(common + ["trainer.total_training_steps=1"], run_dir=tmp_path / "one"),
                        log=_quiet)
    one.fit()
    assert all(torch.equal(p0, p1) for p0, p1 in zip(before, one.actor.parameters()))  # lr 0: no move
    resumed = build_trainer(micro_config(common + ["trainer.resume=true"], run_dir=tmp_path / "one"), log=_quiet)
    resumed.fit()
    for p1, p2 in zip(full.actor.parameters(), resumed.actor.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6)

    shared = build_trainer(micro_config(["algo=turn_ppo", "critic.shared_backbone=true", "trainer.test_freq=0",
                                         "trainer.total_training_steps=2", "trainer.save_freq=0",
                                         "actor_rollout_ref.actor.optim.lr_warmup_steps=2"],
                                        run_dir=tmp_path / "shared"), log=_quiet)
    shared.fit()
    assert [g["lr"] for g in shared.actor_optim.param_groups] == pytest.approx([a_lr / 2, c_lr / 2])


def test_time_budget_stop_then_resume_matches_uninterrupted_run(tmp_path):
    """A run stopped by its time budget (held-out eval + checkpoint at an odd step, as compare.sh's DEADLINE does)
    and resumed trains exactly as one that never stopped: the extra evaluation leaves the training streams alone."""
    common = ["algo=turn_ppo", "trainer.save_freq=0", "trainer.test_freq=0", "trainer.total_training_steps=3"]
    full = build_trainer(micro_config(common, run_dir=tmp_path / "full"), log=_quiet)
    full.fit()
    part = build_trainer(micro_config(common + ["trainer.time_budget_s=1e-6"], run_dir=tmp_path / "part"),
                         log=_quiet)
    part.fit()
    assert part.step == 1
    resumed = build_trainer(micro_config(common + ["trainer.resume=true"], run_dir=tmp_path / "part"), log=_quiet)
    resumed.fit()

    def rows(p):
        return [json.loads(l) for l in (p / "metrics.jsonl").read_text().splitlines()]

    a, b = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    assert "val/success" in b[1] and "val/success" not in a[1]  # the budget stop's own evaluation
    for ra, rb in zip(a, b):
        train_keys = [k for k in ra if not k.startswith(("perf/", "val/")) and k != "step"]
        assert ra["step"] == 0 or {"actor/pg_loss", "critic/value_loss", "env/reward"} <= set(train_keys), ra
        for k in train_keys:
            assert ra[k] == pytest.approx(rb[k], rel=RESUME_RTOL, abs=RESUME_ATOL), (ra["step"], k)
    for p1, p2 in zip(full.actor.parameters(), resumed.actor.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6)


@pytest.mark.parametrize("override,key", [
    (["algo=grpo", "es_manager.train.group_size=1"], "group_size"),
    (["es_manager.train.env_configs.n_groups=[5]"], "n_groups"),
    (["ppo_mini_batch_size=99"], "ppo_mini_batch_size"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=nope"], "loss_mode"),
    (["algorithm.adv_estimator=nope"], "adv_estimator"),
    (["custom_envs.SimpleSokoban.env_type=nope"], "env_type"),
    (["algorithm.gamma=1.5"], "gamma"),
    (["algo=turn_ppo", "critic.level=token"], "critic.level"),
    (["trainer.time_budget_s=0"], "time_budget_s"),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "actor_rollout_ref.actor.clip_ratio_c"),
    (["actor_rollout_ref.actor.policy_loss.clip_bias_stat=max"], "actor_rollout_ref.actor.policy_loss.clip_bias_stat"),
    (["actor_rollout_ref.actor.policy_loss.clip_bias_threshold=0.5"], "policy_loss.clip_bias_threshold"),
    (["algo=grpo", "algorithm.bootstrap_truncated=true"], "algorithm.bootstrap_truncated"),
])
def test_bad_config_fails_before_work_naming_the_key(override, key, tmp_path):
    cfg = micro_config(override, run_dir=tmp_path)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(cfg)


def test_unknown_algo_or_env_group_is_a_clear_error():
    with pytest.raises(ValueError, match=r"algo=nope: no config/algo/nope.yaml \(algo choices: bi_level_gae, grpo"):
        micro_config(["algo=nope"])
    with pytest.raises(ValueError, match=r"env=sokobann: .*did you mean env=sokoban\?"):
        micro_config(["env=sokobann"])


def test_nonfinite_updates_are_skipped_then_stop(tmp_path):
    cfg = micro_config(["algo=token_ppo", "trainer.max_nonfinite_steps=2", "trainer.total_training_steps=5"],
                       run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    real = tr.actor_loss

    def nan_loss(mb, counts=None):
        loss, m = real(mb, counts)
        return loss * float("nan"), m

    tr.actor_loss = nan_loss
    before = [p.detach().clone() for p in tr.actor.parameters()]
    with pytest.raises(RuntimeError, match="non-finite"):
        tr.fit()
    assert tr.step == 1  # step 1 skipped its actor updates; step 2 skipped them again and stopped the run
    assert all(torch.equal(a, b) for a, b in zip(before, tr.actor.parameters()))


def test_eval_checkpoint_schema(tmp_path):
    from ragen_turn.evaluate import evaluate_checkpoint, format_table

    cfg = micro_config(["algo=grpo", "trainer.total_training_steps=1"], run_dir=tmp_path)
    build_trainer(cfg, log=_quiet).fit()
    ecfg = micro_config([], run_dir=tmp_path)
    with open_dict(ecfg):
        ecfg.checkpoint = str(tmp_path)
    played = []
    m = evaluate_checkpoint(ecfg, on_envs=played.append)
    for k in ("val/success", "val/reward", "val/turns", "val/invalid_action_rate", "episodes", "checkpoint"):
        assert k in m
    assert m["episodes"] == 2 and 0.0 <= m["val/success"] <= 1.0
    # the hook gets the played envs, in their last state: what benchmarks/sokoban_failures.py reads
    slots = played[0].slots
    assert len(slots) == 2 and all(sl.env.seed == sl.seed is not None for sl in slots)
    assert sum(sl.env.success for sl in slots) / 2 == m["val/success"]
    table = format_table(m, "x")
    assert table.splitlines()[0].startswith("| model | episodes | success")


def test_advantage_metrics_split_capped_turns():
    from ragen_turn.engines.advantages import advantage_metrics

    # row 0: turn 0 has 3 tokens (the cap), turn 1 has 1; row 1: one turn of 2 tokens; -1 = env / padding
    turn_ids = torch.tensor([[0, 0, 0, -1, 1, -1], [-1, 0, 0, -1, -1, -1]])
    mask = (turn_ids >= 0).float()
    adv = torch.tensor([[1.0, 2.0, 3.0, 9.0, -1.0, 9.0], [9.0, -2.0, 0.0, 9.0, 9.0, 9.0]])
    m = advantage_metrics(adv, mask, turn_ids, response_length=3)
    assert m["response_length/capped_turn_frac"] == pytest.approx(1 / 3)
    assert m["adv/capped_turn_mean"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert m["adv/other_turn_mean"] == pytest.approx((-1.0 + -1.0) / 2)  # turns with means -1 and -1
    assert m["adv/mean"] == pytest.approx((1 + 2 + 3 - 1 - 2 + 0) / 6)
    none_capped = advantage_metrics(adv, mask, turn_ids, response_length=4)
    assert none_capped["response_length/capped_turn_frac"] == 0.0 and "adv/capped_turn_mean" not in none_capped


def test_starpo_s_group_filter_keeps_top_groups_by_std_or_mean():
    from ragen_turn.engines.rollout_filter import kept_rows

    gids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    rewards = torch.tensor([0.0, 10.0, 5.0, 5.0, 1.0, 2.0, 7.0, 9.0])  # stds 5, 0, .5, 1 ; means 5, 5, 1.5, 8
    assert kept_rows(gids, rewards, 0.5, "std").tolist() == [0, 1, 6, 7]
    assert kept_rows(gids, rewards, 0.25, "mean").tolist() == [6, 7]
    assert kept_rows(gids, rewards, 1.0, "std").tolist() == list(range(8))


def test_kl_to_reference_and_entropy_bonus(tmp_path):
    cfg = micro_config(["algo=turn_ppo", "actor_rollout_ref.actor.use_kl_loss=true",
                        "actor_rollout_ref.actor.kl_loss_coef=0.1", "actor_rollout_ref.actor.entropy_coeff=0.01",
                        "trainer.total_training_steps=2"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = mixed_policy(tr.tokenizer)
    assert tr.ref is not None and all(not p.requires_grad for p in tr.ref.parameters())
    ref_before = [p.detach().clone() for p in tr.ref.parameters()]
    last = tr.fit()
    # the first update starts at the reference (KL 0); after one step the policy has moved away from it
    assert last["actor/kl_loss"] > 0 and math.isfinite(last["actor/entropy"]) and last["actor/entropy"] > 0
    assert all(torch.equal(a, b) for a, b in zip(ref_before, tr.ref.parameters()))  # the reference stays frozen


def test_logprobs_and_hidden_match_the_separate_forwards():
    from ragen_turn.models import logprobs_and_hidden, sequence_logprobs
    from ragen_turn.models.logprobs import base_model

    tr = build_trainer(micro_config(["algo=turn_ppo", "critic.shared_backbone=true"]), log=_quiet)
    batch = tr.rollout(0)
    ids, am, pos = (t.to(tr.device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
    with torch.no_grad():
        logp, ent, hidden = logprobs_and_hidden(tr.actor, ids, am, pos)
        ref_logp, ref_ent = sequence_logprobs(tr.actor, ids, am, pos, return_entropy=True)
        base = base_model(tr.actor)(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
        values = tr.critic(ids, am, pos)
    assert torch.allclose(logp, ref_logp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-6)
    assert torch.allclose(hidden, base, atol=1e-6)  # the last hidden state is taken after the final norm
    assert torch.allclose(tr.critic.values_from_hidden(hidden), values, atol=1e-6)


def test_shared_backbone_critic_trains_with_the_actor_and_resumes(tmp_path):
    common = ["algo=turn_ppo", "critic.shared_backbone=true", "critic.optim.lr=1e-2", "trainer.save_freq=1"]
    tr = build_trainer(micro_config(common + ["trainer.total_training_steps=1"], run_dir=tmp_path), log=_quiet)
    # no second backbone: the critic's backbone parameters are the actor's own tensors
    actor_ids = {id(p) for p in tr.actor.parameters()}
    critic_backbone = [p for n, p in tr.critic.named_parameters() if not n.startswith("value_head")]
    assert critic_backbone and all(id(p) in actor_ids for p in critic_backbone)
    assert tr.critic_optim is None
    actor0 = [p.detach().clone() for p in tr.actor.parameters()]
    head0 = tr.critic.value_head.weight.detach().clone()
    tr.fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["step"] == 1 and math.isfinite(row["critic/value_loss"]) and math.isfinite(row["actor/pg_loss"])
    assert not torch.equal(tr.critic.value_head.weight, head0)  # the joint loss reached the head
    assert any(not torch.equal(p, q) for p, q in zip(tr.actor.parameters(), actor0))
    ckpt = tmp_path / "checkpoints" / (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert (ckpt / "critic" / "value_head.safetensors").is_file()
    assert not (ckpt / "critic" / "model.safetensors").exists()  # the backbone is saved once, as the actor
    resumed = build_trainer(micro_config(common + ["trainer.resume=true"], run_dir=tmp_path), log=_quiet)
    assert resumed.step == 1
    assert torch.equal(resumed.critic.value_head.weight, tr.critic.value_head.weight)


def test_shared_backbone_needs_equal_epochs():
    cfg = micro_config(["algo=turn_ppo", "critic.shared_backbone=true", "critic.ppo_epochs=2"])
    with pytest.raises(ValueError, match=r"critic\.ppo_epochs"):
        validate_config(cfg)


@pytest.mark.parametrize("temperature,micro", [(0.0, 0), (1.0, 3)])
def test_prefix_cache_gives_the_same_episodes_as_fresh_prefills(temperature, micro):
    """Reusing keys/values across turns (rows matched by prefix, chunks of ``micro`` rows, rows
    finishing at different turns) samples exactly what a fresh prefill every turn samples."""
    from ragen_turn.engines.local.sampler import LocalSampler
    from ragen_turn.rollout import ChatFormatter, context_config, run_episodes

    cfg = micro_config(["agent_proxy.max_turn=4", "actor_rollout_ref.rollout.response_length=12",
                        "es_manager.train.env_groups=3", "es_manager.train.group_size=2"])
    tr = build_trainer(cfg, log=_quiet)
    torch.manual_seed(0)
    with torch.no_grad():  # a random, sharper model: answers of varied lengths, some valid moves
        for p in tr.actor.parameters():
            p.mul_(4.0)
    runs = {}
    for cached in (False, True):
        sampler = LocalSampler(tr.actor, tr.tokenizer, temperature=temperature, micro_batch_size=micro,
                               generator=torch.Generator().manual_seed(5), prefix_cache=cached, device=tr.device)
        eps = run_episodes(tr.train_envs.assign_seeds(0, 0), sampler, ChatFormatter(tr.tokenizer), context_config(cfg))
        runs[cached] = (eps, sampler.cached_tokens_reused, sampler._cached)
    fresh, cached = runs[False][0], runs[True][0]
    assert [e.token_ids for e in fresh] == [e.token_ids for e in cached]
    assert max(e.num_turns for e in fresh) > 1
    assert runs[False][1] == 0 and runs[True][1] > 0  # later turns reused the earlier turns' tokens
    assert runs[True][2] == []  # the cache is dropped when the rollout ends


def _trainer_with_uneven_turns(cfg):
    """A micro trainer whose end-of-message token is likelier, so a batch's turns end at different steps (the
    sampler tests' rows of different lengths)."""
    tr = build_trainer(cfg, log=_quiet)
    torch.manual_seed(0)
    with torch.no_grad():
        tr.actor.get_input_embeddings().weight[tr.tokenizer.eos_token_id] *= 50.0
    return tr


@pytest.mark.parametrize("decode", ["static", "compiled"])
@pytest.mark.parametrize("cached", [False, True])
def test_static_and_compiled_decode_sample_what_the_dynamic_cache_samples(decode, cached):
    """A fixed-size cache (and its compiled step) gives the same multi-turn episodes as the growing cache for one
    seed: rows of different prompt lengths, stopping at different steps, chunks of 4 rows, with and without the
    prefix cache (whose kept keys/values then come from the static cache)."""
    from ragen_turn.engines.local.sampler import LocalSampler
    from ragen_turn.rollout import ChatFormatter, context_config, run_episodes

    cfg = micro_config(["agent_proxy.max_turn=3", "actor_rollout_ref.rollout.response_length=10",
                        "es_manager.train.env_groups=3", "es_manager.train.group_size=2"])
    tr = _trainer_with_uneven_turns(cfg)
    runs, logits = {}, {}
    for how in ("dynamic", decode):
        sampler = LocalSampler(tr.actor, tr.tokenizer, temperature=1.0, micro_batch_size=4, decode=how,
                               generator=torch.Generator().manual_seed(5), prefix_cache=cached, device=tr.device)
        seen, sample = logits.setdefault(how, []), sampler._sample  # every step's logits, as sampled from
        sampler._sample = lambda x, sample=sample, seen=seen: (seen.append(x.clone()), sample(x))[1]
        runs[how] = (run_episodes(tr.train_envs.assign_seeds(0, 0), sampler, ChatFormatter(tr.tokenizer),
                                  context_config(cfg)), sampler.cached_tokens_reused)
    dynamic, other = runs["dynamic"][0], runs[decode][0]
    assert [e.token_ids for e in dynamic] == [e.token_ids for e in other]
    assert len(logits["dynamic"]) == len(logits[decode]) > 20
    for a, b in zip(logits["dynamic"], logits[decode]):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()
    assert max(e.num_turns for e in dynamic) > 1
    assert len({sum(e.response_mask) for e in dynamic}) > 1  # rows sampled different numbers of tokens
    assert runs["dynamic"][1] == runs[decode][1] and (runs[decode][1] > 0) == cached


def test_static_decode_logits_match_the_dynamic_cache():
    """Greedy, no stops: the logits of every decode step from the static cache equal the growing cache's to float
    rounding (the longer, masked cache sums its attention in another order), and the static cache's length is the
    prefill width + max_new_tokens rounded up to its bucket."""
    from ragen_turn.engines.local.sampler import LocalSampler
    from ragen_turn.models.kv_cache import STATIC_BUCKET, to_static

    tr = build_trainer(micro_config([]), log=_quiet)
    torch.manual_seed(1)
    V = len(tr.tokenizer)
    prompts = [torch.randint(0, V, (n,)).tolist() for n in (7, 12, 3)]
    seen = {}
    for how in ("dynamic", "static"):
        s = LocalSampler(tr.actor, tr.tokenizer, temperature=0.0, stop_strings=(), device=tr.device, decode=how)
        s.stop_ids, s._stop_ids_t = set(), torch.tensor([], dtype=torch.long)
        steps, sample = [], s._sample
        s._sample = lambda logits, sample=sample, steps=steps: (steps.append(logits.clone()), sample(logits))[1]
        seen[how] = (s.generate(prompts, 9), torch.stack(steps))
        if how == "static":
            logits, cache, attn, *_ = s._prefill(prompts, [])
            fixed, mask = to_static(tr.actor, cache, attn, 9)
            assert mask.shape == (3, STATIC_BUCKET) and fixed.layers[0].keys.shape[2] == mask.shape[1]
            assert mask[:, :12].equal(attn) and int(mask[:, 12:].sum()) == 0
    assert seen["dynamic"][0] == seen["static"][0]
    assert seen["dynamic"][1].shape == (9, 3, V)
    assert torch.allclose(seen["dynamic"][1], seen["static"][1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cached,micro,arch", [(True, 0, "qwen2"), (False, 4, "qwen2"), (True, 4, "llama")])
def test_lean_forward_samples_what_the_model_forward_samples(cached, micro, arch):
    """The lean sampler (models/lean.py on one key/value buffer, stopped rows compacted out, stops found on token
    ids) gives token-identical multi-turn episodes to the model's own forward for one seed, and every step's
    logits within 1e-5: rows of different prompt lengths stopping at different steps, with and without the prefix
    cache, in chunks; a model with 2 query heads per key/value head."""
    from ragen_turn.engines.local.sampler import LocalSampler
    from ragen_turn.rollout import ChatFormatter, context_config, run_episodes

    cfg = micro_config(["agent_proxy.max_turn=3", "actor_rollout_ref.rollout.response_length=10",
                        "es_manager.train.env_groups=4", "es_manager.train.group_size=2", f"model.arch={arch}",
                        "model.num_attention_heads=4", "model.num_key_value_heads=2"])
    tr = _trainer_with_uneven_turns(cfg)
    runs, logits = {}, {}
    for lean in (False, True):
        sampler = LocalSampler(tr.actor, tr.tokenizer, temperature=1.0, micro_batch_size=micro, lean=lean,
                               generator=torch.Generator().manual_seed(5), prefix_cache=cached, device=tr.device)
        assert (sampler._lean is not None) == lean
        seen, sample = logits.setdefault(lean, []), sampler._sample
        sampler._sample = lambda x, sample=sample, seen=seen: (seen.append(x.clone()), sample(x))[1]
        runs[lean] = (run_episodes(tr.train_envs.assign_seeds(0, 0), sampler, ChatFormatter(tr.tokenizer),
                                   context_config(cfg)), sampler.cached_tokens_reused)
    old, new = runs[False][0], runs[True][0]
    assert [e.token_ids for e in old] == [e.token_ids for e in new]
    assert [e.response_mask for e in old] == [e.response_mask for e in new]
    assert max(e.num_turns for e in old) > 1
    assert len({sum(e.response_mask) for e in old}) > 1  # rows sampled different numbers of tokens
    assert runs[False][1] == runs[True][1] and (runs[True][1] > 0) == cached
    assert len(logits[False]) >= len(logits[True]) > 10  # the old path also steps after the last row stopped
    for a, b in zip(logits[False], logits[True]):
        live = b.abs().sum(-1) > 0  # rows compacted out of the lean batch sample from zeros (their draw is unused)
        assert live.any() and torch.allclose(a[live], b[live], atol=1e-5, rtol=0), (a[live] - b[live]).abs().max()


def test_lean_forward_matches_the_model_on_a_left_padded_prefill_and_decode():
    """LeanLM's logits equal the model's forward (left-padded prompts, then decode steps at the next positions)
    to float rounding, and the lean path is taken only for models it computes exactly."""
    from ragen_turn.models.lean import LeanLM, lean_supported

    tr = build_trainer(micro_config(["model.num_attention_heads=4", "model.num_key_value_heads=2"]), log=_quiet)
    model = tr.actor
    lean = LeanLM(model)
    torch.manual_seed(2)
    V = len(tr.tokenizer)
    lens = [9, 4, 1]
    B, N = len(lens), max(lens)
    ids = torch.zeros(B, N, dtype=torch.long)
    am = torch.zeros(B, N, dtype=torch.long)
    for b, n in enumerate(lens):
        ids[b, N - n:] = torch.randint(3, V, (n,))
        am[b, N - n:] = 1
    pos = (am.cumsum(1) - 1).clamp(min=0)
    buf = lean.new_buffer(B, N + 3)
    for k, v in zip(buf.keys, buf.values):
        k.zero_(), v.zero_()
    cols = torch.arange(N)
    mask = (am.bool()[:, None, :] & (cols[None, None] <= cols[None, :, None])) | torch.eye(N, dtype=torch.bool)[None]
    with torch.no_grad():
        got = lean.forward(ids, pos, buf, 0, mask[:, None])
        ref = model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, -1]
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
        full_ids, full_am = ids, am
        for step in range(3):  # decode: one token a step at slot N + step
            nxt = torch.randint(3, V, (B, 1))
            full_ids = torch.cat([full_ids, nxt], 1)
            full_am = torch.cat([full_am, torch.ones(B, 1, dtype=torch.long)], 1)
            p = (full_am.cumsum(1) - 1)[:, -1:]
            got = lean.forward(nxt, p, buf, N + step, full_am.bool()[:, None, None, :])
            ref = model(input_ids=full_ids, attention_mask=full_am,
                        position_ids=(full_am.cumsum(1) - 1).clamp(min=0)).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-5, rtol=0), (step, (got - ref).abs().max())
    assert lean_supported(model)
    model.config.use_sliding_window = True
    assert not lean_supported(model)  # sliding windows: the model's own forward
    model.config.use_sliding_window = False


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_the_scoring_forward(temperature, tmp_path):
    """``rollout.sampler_logprobs``: each sampled token's log-prob kept by the lean sampler (from the logits it was
    drawn from, at the temperature) equals the scoring forward's to float rounding, 0 off the response tokens;
    the score then takes them as the old log-probs. Off (the default): nothing is kept, the forward runs."""
    cfg = micro_config(["algo=turn_ppo", "actor_rollout_ref.rollout.sampler_logprobs=true", "agent_proxy.max_turn=3",
                        "actor_rollout_ref.rollout.response_length=10", "es_manager.train.env_groups=3",
                        f"actor_rollout_ref.rollout.temperature={temperature}",
                        "actor_rollout_ref.rollout.micro_batch_size=4"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    batch = tr.rollout(0)
    assert batch.sampled_logp is not None and batch.sampled_logp.shape == batch.input_ids.shape
    ref = tr._forward_all(lambda *a: tr.logprobs(tr.actor, *a), batch)
    m = batch.response_mask.bool()
    assert int(m.sum()) > 10 and max(e.num_turns for e in batch.episodes) > 1
    assert not batch.sampled_logp[~m].any()
    torch.testing.assert_close(batch.sampled_logp[m], ref[m], rtol=0, atol=1e-5)
    tr.score(batch)
    assert torch.equal(batch.old_logp, batch.sampled_logp * batch.response_mask)
    with open_dict(tr.cfg):
        tr.cfg.actor_rollout_ref.rollout.sampler_logprobs = False
    tr.sampler.record_logprobs = False
    off = tr.rollout(0)
    assert off.sampled_logp is None
    tr.score(off)
    torch.testing.assert_close(off.old_logp, ref, rtol=0, atol=0)  # the same rollout, recomputed


def test_prefix_cache_logits_match_a_full_prefill():
    from ragen_turn.engines.local.sampler import LocalSampler

    tr = build_trainer(micro_config([]), log=_quiet)
    torch.manual_seed(1)
    V = len(tr.tokenizer)
    prompts = [torch.randint(0, V, (n,)).tolist() for n in (7, 12, 3)]
    s = LocalSampler(tr.actor, tr.tokenizer, temperature=0.0, stop_strings=(), prefix_cache=True, device=tr.device)
    s.stop_ids, s._stop_ids_t = set(), torch.tensor([], dtype=torch.long)
    first = s.generate(prompts, 4)
    # next turn: rows 0 and 2 continue (prompt + response + 5 new tokens), row 1 is a new prompt
    nxt = [prompts[0] + first[0] + [11, 12, 13, 14, 15], torch.randint(0, V, (9,)).tolist(),
           prompts[2] + first[2] + [21, 22]]
    previous, s._cached = s._cached, []
    logits, *_ = s._prefill(nxt, previous)
    fresh = LocalSampler(tr.actor, tr.tokenizer, temperature=0.0, device=tr.device)
    ref, *_ = fresh._prefill(nxt, [])
    assert s.cached_tokens_reused == (len(prompts[0]) + 3) + (len(prompts[2]) + 3)
    assert torch.allclose(logits, ref, atol=1e-5), (logits - ref).abs().max()


def test_eval_uses_the_runs_own_settings_plus_overrides(tmp_path):
    import subprocess
    import sys

    from helpers import MICRO_MODEL
    from ragen_turn.evaluate import config_for_eval, evaluate_checkpoint, run_config_path
    from ragen_turn.compose import compose_config

    run = tmp_path / "run"
    train = MICRO_MODEL + ["algo=grpo", "trainer.total_training_steps=1", "agent_proxy.max_turn=1", "device=cpu",
                           "actor_rollout_ref.rollout.response_length=6", "es_manager.train.env_groups=2",
                           "es_manager.val.env_groups=2", "ppo_mini_batch_size=4", f"trainer.default_local_dir={run}"]
    subprocess.run([sys.executable, "-m", "ragen_turn.train", *train], check=True, capture_output=True)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert run_config_path(str(run)) == run_config_path(str(ckpt / "actor")) == (run / "config.yaml").resolve()
    overrides = ["env=sokoban", "+checkpoint=" + str(run), "es_manager.val.env_groups=3",
                 "actor_rollout_ref.rollout.val_temperature=0", f"+eval_output={tmp_path / 'x.json'}"]
    cli = compose_config(overrides)  # the default config: 5 turns, 64-token responses
    cfg = config_for_eval(cli, overrides)
    assert cfg.agent_proxy.max_turn == 1 and cfg.actor_rollout_ref.rollout.response_length == 6
    assert cfg.es_manager.val.env_groups == 3 and list(cfg.es_manager.val.env_configs.n_groups) == [3]
    assert cfg.actor_rollout_ref.rollout.val_temperature == 0 and cfg.model.hidden_size == 32
    assert cfg.checkpoint == str(run) and cfg.eval_output == str(tmp_path / "x.json")
    m = evaluate_checkpoint(cfg)
    assert m["episodes"] == 3 and m["val/turns"] == 1.0
    # without recorded overrides: the run's resolved config.yaml plus ours
    (run / "hydra" / ".hydra" / "overrides.yaml").unlink()
    cfg2 = config_for_eval(cli, ["actor_rollout_ref.rollout.val_temperature=0"])
    assert cfg2.agent_proxy.max_turn == 1 and cfg2.actor_rollout_ref.rollout.val_temperature == 0
    # a plain model directory (no run around it) keeps the command's config
    plain = compose_config(["+checkpoint=" + str(tmp_path / "model")])
    assert config_for_eval(plain, []) is plain


def test_a_finished_run_is_not_overwritten_by_accident(tmp_path):
    common = ["algo=grpo", "trainer.total_training_steps=1"]
    build_trainer(micro_config(common, run_dir=tmp_path), log=_quiet).fit()
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="trainer.overwrite=true"):
        build_trainer(micro_config(common, run_dir=tmp_path), log=_quiet)
    assert (tmp_path / "metrics.jsonl").read_text() == before  # refused before touching anything
    tr = build_trainer(micro_config(common + ["trainer.overwrite=true"], run_dir=tmp_path), log=_quiet)
    assert not (tmp_path / "metrics.jsonl").exists() and tr.step == 0  # started over


def test_critic_warmup_updates_only_the_critic_for_its_steps(tmp_path):
    """trainer.critic_warmup=3 (verl's rule: no actor update while critic_warmup > step, steps from 1): steps 1-2
    change the critic and leave the actor's weights as they were; step 3 updates both. A critic-free algo or a
    shared backbone refuses it."""
    cfg = micro_config(["algo=turn_ppo", "trainer.critic_warmup=3", "es_manager.train.env_groups=2",
                        "es_manager.train.group_size=2", "agent_proxy.max_turn=2", "ppo_mini_batch_size=4",
                        "micro_batch_size_per_gpu=4"], run_dir=tmp_path)
    validate_config(cfg)
    tr = build_trainer(cfg, log=_quiet)

    def weights(model):
        return [p.detach().clone() for p in model.parameters()]

    for step in (1, 2, 3):
        actor, critic = weights(tr.actor), weights(tr.critic)
        metrics = tr.train_step()
        tr.step += 1  # as fit() counts them
        actor_moved = any(not torch.equal(a, b) for a, b in zip(actor, tr.actor.parameters()))
        critic_moved = any(not torch.equal(a, b) for a, b in zip(critic, tr.critic.parameters()))
        assert critic_moved, step
        assert actor_moved == (step == 3), step
        assert metrics.get("actor/critic_warmup", 0.0) == (1.0 if step < 3 else 0.0), step
        assert ("actor/pg_loss" in metrics) == (step == 3), step
    for bad in (["algo=grpo"], ["algo=turn_ppo", "critic.shared_backbone=true"]):
        with pytest.raises(ValueError, match="trainer.critic_warmup=3"):
            validate_config(micro_config(bad + ["trainer.critic_warmup=3"], run_dir=tmp_path / "bad"))


def test_provenance_records_host_versions_and_starting_weights_and_resume_appends(tmp_path):
    """<run>/provenance.json: one entry per start or resume (step, CPU, versions); a fresh start also holds the sha256
    of the actor's starting weights, equal for two runs of one config on one machine; --keep-runs copies the file."""
    from ragen_turn.engines.runlog import weights_sha256
    from ragen_turn.report import keep_runs, load_run

    common = ["algo=grpo", "trainer.save_freq=1", "trainer.total_training_steps=1"]
    tr = build_trainer(micro_config(common, run_dir=tmp_path / "a"), log=_quiet)
    start_sha = weights_sha256(tr.actor)
    tr.fit()
    other = build_trainer(micro_config(common, run_dir=tmp_path / "b"), log=_quiet)
    entries = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert len(entries) == 1 and entries[0]["step"] == 0 and entries[0]["start_weights_sha256"] == start_sha
    assert json.loads((tmp_path / "b" / "provenance.json").read_text())[0]["start_weights_sha256"] == start_sha
    assert entries[0]["torch"] == torch.__version__ and entries[0]["cpu"]
    with torch.no_grad():
        next(other.actor.parameters()).view(-1)[0] += 1e-3  # any change of any weight changes the hash
    assert weights_sha256(other.actor) != start_sha
    del other
    resumed = build_trainer(micro_config(["algo=grpo", "trainer.save_freq=1", "trainer.total_training_steps=2",
                                          "trainer.resume=true"], run_dir=tmp_path / "a"), log=_quiet)
    resumed.fit()
    entries = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert [e["step"] for e in entries] == [0, 1] and "start_weights_sha256" not in entries[1]
    kept = keep_runs([load_run(tmp_path / "a")], tmp_path / "kept")
    assert json.loads((kept / "grpo_s0" / "provenance.json").read_text()) == entries  # kept as <algo>_s<seed>


def _perturbed_turn_ppo(tmp_path, extra, name):
    """A turn_ppo trainer on 8 uneven episodes, scored, with its actor perturbed after scoring (ratios away from 1:
    many turns clipped)."""
    cfg = micro_config(["algo=turn_ppo", "es_manager.train.env_groups=4", "es_manager.train.group_size=2",
                        "agent_proxy.max_turn=3", "actor_rollout_ref.rollout.response_length=12",
                        "actor_rollout_ref.actor.optim.lr=1e-3", *extra], run_dir=tmp_path / name)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = uneven_policy(tr.tokenizer)
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in tr.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return tr, batch


def test_target_kl_stops_the_update_at_the_first_mini_batch_past_it(tmp_path):
    """target_kl (CleanRL's / SB3's): a mini-batch whose approx KL before its step is above the target is not
    stepped and the rest of the update is dropped; the trace and the log say so; max_update_kl's rollback stays off."""
    lines = []
    tr, batch = _perturbed_turn_ppo(tmp_path, ["ppo_mini_batch_size=4", "actor_rollout_ref.actor.target_kl=1e-9"],
                                    "stop")
    tr.log = lines.append
    before = [p.detach().clone() for p in tr.actor.parameters()]
    m = tr.update(batch)
    trace = tr.update_trace["actor"]
    assert [t["actor/stepped"] for t in trace] == [0.0] and trace[0]["actor/approx_kl"] > 1e-9
    assert m["actor/kl_stop"] == 1.0 and m["actor/minibatches_stepped"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.actor.parameters()))  # nothing stepped
    assert any("target_kl" in x and "0 mini-batch(es) stepped" in x for x in lines), lines
    assert "actor/update_rolled_back" not in m
    # a target the perturbation stays under: every mini-batch steps
    tr2, batch2 = _perturbed_turn_ppo(tmp_path, ["ppo_mini_batch_size=4", "actor_rollout_ref.actor.target_kl=10"],
                                      "go")
    m2 = tr2.update(batch2)
    assert [t["actor/stepped"] for t in tr2.update_trace["actor"]] == [1.0, 1.0] and m2["actor/kl_stop"] == 0.0


def test_step_scale_live_is_an_lr_times_the_live_share(tmp_path):
    """step_scale=live on one mini-batch: the step equals a plain step at lr x actor/live_frac (Adam, no weight
    decay), and the live share is below 1 here (turns clipped), so the step did shrink."""
    tr, batch = _perturbed_turn_ppo(tmp_path, ["ppo_mini_batch_size=8", "actor_rollout_ref.actor.step_scale=live"],
                                    "live")
    m = tr.update(batch)
    live = tr.update_trace["actor"][0]["actor/live_frac"]
    assert 0.0 < live < 1.0 and m["actor/step_scale"] == live
    ref, batch_r = _perturbed_turn_ppo(tmp_path, ["ppo_mini_batch_size=8", "actor_rollout_ref.actor.step_scale=none"],
                                       "plain")
    for g in ref.actor_optim.param_groups:
        g["initial_lr"] = g["initial_lr"] * live
    ref.update(batch_r)
    for a, b in zip(tr.actor.parameters(), ref.actor.parameters()):
        assert torch.equal(a, b)


def test_a_long_training_rollout_says_where_it_is_and_a_short_one_says_nothing(monkeypatch):
    """A rollout that runs for minutes prints a progress line (turn, episodes still going) at most every
    ROLLOUT_PROGRESS_S; a quick one prints none. The clock is faked: each reading 31 s later."""
    from types import SimpleNamespace

    from ragen_turn.engines.local import trainer as local
    from ragen_turn.rollout import runner

    lines = []
    t = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=1"]), log=lines.append)
    t.rollout(0)
    assert not any("[rollout]" in ln for ln in lines), lines
    clock = [0.0]

    def later():
        clock[0] += local.ROLLOUT_PROGRESS_S + 1
        return clock[0]

    monkeypatch.setattr(runner, "time", SimpleNamespace(time=later))
    batch = t.rollout(0)
    said = [ln for ln in lines if ln.startswith("[rollout]")]
    assert said and said[0].startswith("[rollout] step 1: turn 1/2: 4/4 episodes active"), said
    assert batch.batch_size == 4
