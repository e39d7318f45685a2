"""verl's real workers vs the local engine on one batch and the same weights (run in a fresh process).

    python tests/verl_worker_parity.py OUT.json turn_ppo token_ppo st_ppo [--micro N] [--set KEY=VALUE ...]

``--micro N`` sets ``micro_batch_size_per_gpu`` (default 4: one micro-batch per mini-batch of 4 episodes).
``--set`` adds overrides to both engines' configs (e.g. the trust-region knobs, or 8 episodes in 2 mini-batches:
then the local engine walks its mini-batches in row order, as verl does with ``actor.shuffle=false``, in place of
its seeded permutation, which the verl trainer reproduces by reordering the rows, a step this harness skips).

For each algorithm: a local Ray cluster on the CPU platform, verl's FSDP2 actor and critic workers
(``TrainerBuilder.build_trainer``, the run's own code), one train batch played by verl's agent-loop
worker on the hf rollout, then the verl trainer's own phases (``score``, ``compute_advantages``,
``update_critic``, ``update_actor``). The gradients are read from the workers' FSDP modules after the
update (verl zeroes them before its backward, not after). The local engine (``engine=local``) then gets
the same episodes as its own full-row ``Trajectory``, the same weights (the critic's value head included),
and runs its own ``score`` / ``compute_advantages`` / ``update``; its gradients are recorded at its
optimizer step. OUT.json gets, per algorithm, the largest differences (see ``compare``).
tests/test_verl.py runs this and asserts the tolerances.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

# RAGEN_TURN_TEST_DEVICE=cuda runs both engines on the GPU (verl: NCCL, FSDP2 on CUDA, the hf rollout on the GPU)
DEVICE = os.environ.get("RAGEN_TURN_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["VERL_PLATFORM"] = "cpu"  # before anything imports verl
HERE = Path(__file__).resolve().parent
# tests/helpers.py, and this checkout's ragen_turn before any installed one (a venv shared between checkouts)
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

import ragen_turn.engines.verl.cpu_platform  # noqa: E402,F401  (the platform, then verl's other registries)
import ragen_turn.engines.verl.value_model  # noqa: E402,F401
import ragen_turn.engines.verl.token_logprobs  # noqa: E402,F401
import ragen_turn.engines.verl.hf_rollout  # noqa: E402,F401
import ragen_turn.engines.verl.register  # noqa: E402,F401
import ragen_turn.engines.verl.agent_loop  # noqa: E402,F401

MICRO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
HEAD_STD = 0.5  # a non-zero value head, so the critic's backbone gets gradients too
EOS_SCALE = 50.0  # about 0.1 probability of ending a turn at each token
MAX_CONTEXT = 320


def model_dir(root: Path) -> Path:
    """The micro tiny model with a random value head (``score.*``) saved beside the LM weights.

    verl's critic (``*ForTokenClassification``) loads that head; the causal LM ignores it; the local
    critic gets the same tensors.
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from ragen_turn.models import export_model

    path = export_model("tiny", root / "model", model_cfg=MICRO)
    state = {k: v.clone() for k, v in load_file(path / "model.safetensors").items()}
    hidden = MICRO["hidden_size"]
    g = torch.Generator().manual_seed(7)
    # a larger end-of-message embedding (tied to the output layer): some turns stop after a few tokens, so the
    # episodes have different numbers of sampled tokens
    eos = AutoTokenizer.from_pretrained(path).eos_token_id
    state["model.embed_tokens.weight"][eos] *= EOS_SCALE
    state["score.weight"] = torch.randn(1, hidden, generator=g) * HEAD_STD
    state["score.bias"] = torch.randn(1, generator=g) * HEAD_STD
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    return path


def overrides(algo: str, path: Path, run_dir: str, micro: int = 4) -> list:
    return [f"algo={algo}", "model=tiny", f"model.path={path}", "model.warmstart.enable=false",
            f"micro_batch_size_per_gpu={micro}",
            "es_manager.train.env_groups=2", "es_manager.train.group_size=2", "agent_proxy.max_turn=3",
            # a context window that ends one episode after 2 turns (its third turn would start at token 313 and
            # may need 8 more; the others' start at 310-312), so two micro-batches hold different turn counts
            f"agent_proxy.max_context_tokens={MAX_CONTEXT}",
            "actor_rollout_ref.rollout.response_length=8", "ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.grad_clip=1e9", "critic.grad_clip=1e9", f"device={DEVICE}", "seed=3",
            # raw advantages: whitened ones make a first-step turn-mean loss exactly 0 (ratio 1), a weak check
            "algorithm.norm_adv=false",
            f"trainer.default_local_dir={run_dir}"]


# ------------------------------------------------------------------------------------------------
# verl side
# ------------------------------------------------------------------------------------------------
def _engine(self, role: str):
    """The FSDP engine of the actor (role 'actor') or the critic ('critic') inside a verl WorkerDict."""
    for w in self.worker_dict.values():
        inner = getattr(w, "actor", None) if role == "actor" else (None if hasattr(w, "actor") else w)
        if inner is not None:
            return inner.engine
    raise RuntimeError(f"no {role} in this worker")


def _record_grads(worker, role: str) -> None:
    """Inside the worker: keep a copy of the gradients at every optimizer step (verl zeroes them on exit)."""

    def install(self):
        engine = _engine(self, role)
        step = engine.optimizer_step

        def recording_step():
            from torch.distributed.tensor import DTensor

            engine._recorded_grads = {
                n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().cpu().clone()
                for n, p in engine.module.named_parameters() if p.grad is not None}
            return step()

        engine.optimizer_step = recording_step

    import ray

    ray.get(worker.__ray_call__.remote(install))


def _actor_checksum(self) -> float:
    """Inside the worker: the sum of the actor's (full) parameters, as HFServer.parameter_checksum."""
    from torch.distributed.tensor import DTensor

    module = _engine(self, "actor").module
    return float(sum((p.full_tensor() if isinstance(p, DTensor) else p).double().sum() for p in module.parameters()))


def _actor_params(self) -> dict:
    """Inside the worker: the actor's full parameters (CPU copies)."""
    from torch.distributed.tensor import DTensor

    module = _engine(self, "actor").module
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
            for n, p in module.named_parameters()}


def _recorded_grads(worker, role: str) -> dict:
    import ray

    return ray.get(worker.__ray_call__.remote(lambda self: _engine(self, role)._recorded_grads))


def run_verl(cfg):
    import ray

    from ragen_turn.engines.verl import build_verl_config
    from ragen_turn.engines.verl.config import ray_resources, resolve_placement, worker_env
    from ragen_turn.engines.verl.hf_rollout import server_name
    from ragen_turn.engines.verl.trainer import TrainerBuilder, to_trajectory

    vcfg = build_verl_config(cfg)
    p = resolve_placement(cfg)
    ray.init(**ray_resources(p), runtime_env={"env_vars": worker_env(p)}, include_dashboard=False)
    try:
        trainer = TrainerBuilder().build_trainer(vcfg)
        trainer.checkpoint_manager.update_weights(0)
        batch, _ = trainer.rollout(trainer.train_plan.assign_seeds(trainer.rcfg.seed, 0), "train", 0)
        batch = trainer.score(batch, {}, {})
        traj = to_trajectory(batch)
        trainer.compute_advantages(batch, traj)
        out = {"batch": batch, "traj": traj}
        actor_w = trainer.actor_rollout_wg.workers[0]
        _record_grads(actor_w, "actor")
        if trainer.use_critic:
            critic_w = trainer.critic_wg.workers[0]
            _record_grads(critic_w, "critic")
            out["critic_metrics"] = trainer.update_critic(batch, traj)
            out["critic_grads"] = _recorded_grads(critic_w, "critic")
        server = ray.get_actor(server_name(0))
        before = ray.get(server.parameter_checksum.remote())
        out["actor_metrics"] = trainer.update_actor(batch, traj)
        out["actor_grads"] = _recorded_grads(actor_w, "actor")
        trainer.checkpoint_manager.update_weights(1)  # verl's weight sync to the rollout, as after every step
        actor_after = ray.get(actor_w.__ray_call__.remote(_actor_checksum))
        out["actor_params"] = ray.get(actor_w.__ray_call__.remote(_actor_params))
        out["weight_sync"] = {"server_before": before, "server_after": ray.get(server.parameter_checksum.remote()),
                              "actor_after": actor_after, "actor_changed": abs(actor_after - before) > 1e-6}
        out["prompt_length"] = int(vcfg.actor_rollout_ref.rollout.prompt_length)
        return out
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------------------------
# local side
# ------------------------------------------------------------------------------------------------
def local_trajectory(batch, traj, prompt_length: int, pad_id: int):
    """The verl batch's episodes as the local engine's full rows (prompt + response, right padded)."""
    from ragen_turn.rollout import Trajectory
    from ragen_turn.rollout.trajectory import Episode

    eps, spans = [], []
    for i in range(len(batch)):
        attn = batch.batch["attention_mask"][i]
        p_len, r_len = int(attn[:prompt_length].sum()), int(attn[prompt_length:].sum())
        e = traj.episodes[i]
        eps.append(Episode(token_ids=batch.batch["input_ids"][i][attn.bool()].tolist(),
                           response_mask=[0] * p_len + batch.batch["response_mask"][i][:r_len].tolist(),
                           turn_ids=[-1] * p_len + traj.turn_ids[i][:r_len].tolist(), turn_rewards=e.turn_rewards,
                           group_id=e.group_id, env_seed=e.env_seed, tag=e.tag, success=e.success))
        spans.append((p_len, r_len))
    return Trajectory.from_episodes(eps, pad_id), spans


def run_local(cfg, verl_out, path: Path):
    from safetensors.torch import load_file

    from ragen_turn.engines.local.trainer import build_trainer

    t = build_trainer(cfg, log=lambda *_: None)
    if t.critic is not None:
        state = load_file(path / "model.safetensors")
        with torch.no_grad():
            t.critic.value_head.weight.copy_(state["score.weight"])
            t.critic.value_head.bias.copy_(state["score.bias"])
    full, spans = local_trajectory(verl_out["batch"], verl_out["traj"], verl_out["prompt_length"],
                                   t.tokenizer.pad_token_id)
    t.score(full)
    t.compute_advantages(full)
    grads = {}
    step = t._optimizer_step

    def record(model, optim, grad_clip, *scale):
        name = "critic" if model is t.critic else "actor"
        grads[name] = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
        return step(model, optim, grad_clip, *scale)

    t._optimizer_step = record
    bm = int(cfg.ppo_mini_batch_size)
    t._minibatches = lambda n, epoch: [torch.arange(i, min(i + bm, n)) for i in range(0, n, bm)]  # verl's order
    control = all_token_critic_grads(t, full) if cfg.critic.level == "turn" else None
    metrics = t.update(full)
    params = {n: p.detach().cpu().clone() for n, p in t.actor.named_parameters()}
    return {"traj": full, "spans": spans, "metrics": metrics, "grads": grads, "all_token_critic_grads": control,
            "actor_params": params}


def all_token_critic_grads(t, full) -> dict:
    """Control: the critic's gradient had it trained on every response token (the turn returns on each)."""
    from ragen_turn.algos import scatter_turns, value_loss

    t.critic.zero_grad(set_to_none=True)
    full = full.to(t.device)  # the batch stays on the CPU; the local engine moves each micro-batch
    values = t.critic_values(full.input_ids, full.attention_mask, full.position_ids)
    returns = scatter_turns(full.turn_returns, full.turn_ids) * full.response_mask  # return_h on turn h
    loss, _ = value_loss(values, full.values, returns, full.response_mask, t.cfg.critic.cliprange_value)
    loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in t.critic.named_parameters()}
    t.critic.zero_grad(set_to_none=True)
    return grads


# ------------------------------------------------------------------------------------------------
def _rel(a: dict, b: dict, rename=lambda n: n) -> dict:
    """max |a - b| / max |b| over all tensors (names of ``a`` mapped by ``rename``), and which tensors were compared."""
    worst, scale, names = 0.0, 0.0, []
    for n, g in a.items():
        m = rename(n)
        if m not in b:
            raise KeyError(f"gradient {n} ({m}) has no local counterpart; local has {sorted(b)[:6]}")
        worst = max(worst, float((g - b[m]).abs().max()))
        scale = max(scale, float(b[m].abs().max()))
        names.append(n)
    missing = sorted(set(b) - {rename(n) for n in a})
    return {"max_abs_diff": worst, "max_abs_grad": scale, "rel": worst / max(scale, 1e-30), "tensors": len(names),
            "local_only": missing}


def _critic_name(n: str) -> str:
    """verl's ``Qwen2ForTokenClassification`` names -> the local ``CriticModel``'s."""
    if n.startswith("model."):
        return "backbone." + n[len("model."):]
    if n.startswith("score."):
        return "value_head." + n[len("score."):]
    return n


_MODEL_PATH: list = []  # the run's model folder (set by main)


def _initial_params(like: dict) -> dict:
    """The actor's parameters before the update (the model file), named as the local actor's."""
    from safetensors.torch import load_file

    state = load_file(_MODEL_PATH[0] / "model.safetensors")
    return {n: state[n] for n in like}


def compare(v: dict, loc: dict) -> dict:
    from ragen_turn.algos import scatter_turns

    batch, full, spans = v["batch"], loc["traj"], loc["spans"]
    # verl keeps token returns; a turn critic's return_h (local: per turn) goes on each token of turn h
    token_returns = full.returns if full.turn_returns is None else \
        scatter_turns(full.turn_returns, full.turn_ids) * full.response_mask
    local = {k: (None if v is None else v.cpu()) for k, v in (
        ("old_logp", full.old_logp), ("values", full.values), ("advantages", full.advantages),
        ("returns", token_returns))}
    res = {}
    for key, lkey in (("old_log_probs", "old_logp"), ("values", "values"), ("advantages", "advantages"),
                      ("returns", "returns")):
        if key not in batch.batch.keys():
            continue
        worst = 0.0
        for i, (p_len, r_len) in enumerate(spans):
            mask = batch.batch["response_mask"][i, :r_len].bool()
            a = batch.batch[key][i, :r_len][mask]
            b = local[lkey][i, p_len: p_len + r_len][mask]
            worst = max(worst, float((a.float() - b.float()).abs().max()))
        res[f"{key}_max_abs_diff"] = worst
    am, lm = v["actor_metrics"], loc["metrics"]
    res["pg_loss"] = [float(am["actor/pg_loss"]), float(lm["actor/pg_loss"])]
    # the loss's statistics (micro-batch shares: verl must sum them as it sums pg_loss, not average them)
    res["stats"] = {k: [float(am[k]), float(lm[k])] for k in ("actor/live_frac", "actor/ratio_mean",
                                                              "actor/approx_kl", "actor/clip_frac_token",
                                                              "actor/clip_frac_turn") if k in am and k in lm}
    res["actor_grad"] = _rel(v["actor_grads"], loc["grads"]["actor"])
    if "critic_grads" in v:
        res["value_loss"] = [float(v["critic_metrics"]["critic/value_loss"]), float(lm["critic/value_loss"])]
        res["critic_grad"] = _rel(v["critic_grads"], loc["grads"]["critic"], _critic_name)
        if loc["all_token_critic_grads"] is not None:  # a turn critic trained on every token would differ this much
            res["critic_grad_vs_all_tokens"] = _rel(v["critic_grads"], loc["all_token_critic_grads"], _critic_name)
        res["turns"] = int(v["traj"].turn_mask.sum())
    # the actor's update (after - before), verl's against the local engine's: the steps themselves (lr, Adam,
    # step_scale, which mini-batches target_kl stepped), not only the gradients
    before = _initial_params(loc["actor_params"])
    res["actor_step"] = _rel({n: p - before[n] for n, p in v["actor_params"].items()},
                             {n: p - before[n] for n, p in loc["actor_params"].items()})
    res["trust_region"] = {k: [float(am[k]), float(lm[k])] for k in ("actor/kl_stop", "actor/minibatches_stepped")
                           if k in am or k in lm}
    res["weight_sync"] = v["weight_sync"]
    res["episodes"] = len(batch)
    res["response_tokens"] = int(batch.batch["response_mask"].sum())
    # per episode: turns and sampled tokens (what a micro-batch split weights by), and prompt + response length
    res["turns_per_episode"] = [int(x) for x in full.turn_mask.sum(-1)]
    res["tokens_per_episode"] = [int(x) for x in full.response_mask.sum(-1)]
    res["length_per_episode"] = [p_len + r_len for p_len, r_len in spans]
    res["turn_starts"] = [[int((full.turn_ids[i] == h).nonzero()[0]) for h in range(n)]
                          for i, n in enumerate(res["turns_per_episode"])]
    return res


def main(out: str, algos: list, micro: int = 4, extra: tuple = ()) -> None:
    from helpers import micro_config

    results = {}
    with tempfile.TemporaryDirectory(prefix="verl_parity_") as d:  # the model and both runs: removed afterwards
        root = Path(d)
        path = model_dir(root)
        _MODEL_PATH[:] = [path]
        for algo in algos:
            # FSDP2 on both platforms (the GPU default is FSDP1): the gradients are read from its DTensors
            vcfg_in = micro_config(["engine=verl", "engine.verl.strategy=fsdp2", "engine.verl.rollout=hf",
                                    *overrides(algo, path, str(root / f"verl_{algo}"), micro), *extra])
            lcfg_in = micro_config([*overrides(algo, path, str(root / f"local_{algo}"), micro), *extra])
            v = run_verl(vcfg_in)
            loc = run_local(lcfg_in, v, path)
            results[algo] = compare(v, loc)
            print(algo, json.dumps(results[algo]), flush=True)
    Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("algos", nargs="+")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], help="an override for both engines (repeatable)")
    args = ap.parse_args()
    main(args.out, args.algos, args.micro, tuple(args.set))
