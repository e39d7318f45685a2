"""``engine=verl engine.verl.device=cuda``, built and checked by verl 0.9.1's own config classes, on a CPU.

The machine the run is for is a :class:`Host` (GPUs, and whether vllm / sglang / flash-attn import), so the
GPU config is mapped as it would be there and then passed through what verl's trainer checks before it
starts workers (``check_verl_config``: ``validate_config``, the actor / rollout / model / critic / reference
dataclasses, verl's ``RolloutReplica`` set-up). The mapped values are compared with numbers written by hand
(docs/verl.md, "On GPUs: the mapping"). Skipped without verl, like tests/test_verl.py.
"""
from __future__ import annotations

import importlib.util

import pytest

from helpers import micro_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None,
                                reason="verl is not installed (pip install -e '.[verl]')")

MICRO_MODEL_CFG = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=64)
ENGINES = frozenset({"vllm", "sglang"})
# one node of 4 GPUs; 16 episodes a step, mini-batches of 8 (2 per worker), micro-batches of 2
NODE = ["engine=verl", "model=tiny", "model.warmstart.enable=false", "engine.verl.device=cuda",
        "trainer.n_gpus_per_node=4", "es_manager.train.env_groups=8", "es_manager.train.group_size=2",
        "ppo_mini_batch_size=8", "micro_batch_size_per_gpu=2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from ragen_turn.models import export_model

    return str(export_model("tiny", tmp_path_factory.mktemp("tiny_hf"), model_cfg=MICRO_MODEL_CFG))


def host(gpus=4, *extra):
    from ragen_turn.engines.verl.config import Host

    return Host(cuda_devices=gpus, installed=ENGINES | frozenset(extra))


def gpu_config(model_dir, *overrides, on=None):
    """Our config on ``on`` (default: a 4-GPU host with vllm and sglang) -> verl's config and objects."""
    from ragen_turn.engines.verl.config import check_verl_config, to_verl_config

    cfg = micro_config([*NODE, f"model.path={model_dir}", *overrides])
    vcfg = to_verl_config(cfg, host=on or host())
    return vcfg, check_verl_config(vcfg)


# hand-written: what each rollout gets on the 4-GPU node, with the overrides of each case
GMU = "engine.verl.gpu_memory_utilization"
CASES = {
    "vllm": (["engine.verl.rollout=vllm", "engine.verl.rollout_tp=2", f"{GMU}=0.6"],
             dict(tp=2, gmu=0.6, replicas=2)),
    "hf": (["engine.verl.rollout=hf", f"{GMU}=0.4"], dict(tp=1, gmu=0.4, replicas=4)),
    "sglang": (["engine.verl.rollout=sglang", "engine.verl.rollout_tp=4", f"{GMU}=0.8"],
               dict(tp=4, gmu=0.8, replicas=1)),
}


@pytest.mark.parametrize("rollout", list(CASES))
def test_gpu_config_passes_verls_checks_with_the_hand_written_mapping(model_dir, rollout):
    """cuda defaults (FSDP1, bf16 when asked, 8 agent workers, checkpointing, torch.compile), through verl."""
    overrides, want = CASES[rollout]
    vcfg, built = gpu_config(model_dir, *overrides, "dtype=bfloat16", "algo=turn_ppo",
                             "actor_rollout_ref.actor.use_kl_loss=true")
    a, r, c, ref = built["actor"], built["rollout"], built["critic"], built["ref"]
    # where: cuda, 4 workers on one node, verl's own platform detection (no cpu platform), Ray counts the GPUs
    assert vcfg.trainer.device == "cuda" and (vcfg.trainer.n_gpus_per_node, vcfg.trainer.nnodes) == (4, 1)
    env = vcfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert "VERL_PLATFORM" not in env and "num_gpus" not in vcfg.ray_kwargs.ray_init
    # the rollout engines: tensor parallel size, memory share, dtype, how many engines verl starts
    assert r.name == rollout and r.tensor_model_parallel_size == want["tp"]
    assert r.gpu_memory_utilization == want["gmu"] and r.dtype == "bfloat16"
    assert len(built["replicas"]) == want["replicas"]
    assert all(rep.world_size == want["tp"] and rep.nnodes == 1 for rep in built["replicas"])
    assert r.agent.num_workers == 8 and vcfg.reward.num_workers == 8
    # batches: 16 episodes, mini-batches of 8, micro-batches of 2 per GPU everywhere verl reads one
    assert vcfg.data.train_batch_size == 16 and a.ppo_mini_batch_size == 8 and c.ppo_mini_batch_size == 8
    assert a.ppo_micro_batch_size_per_gpu == 2 and r.log_prob_micro_batch_size_per_gpu == 2
    assert c.ppo_micro_batch_size_per_gpu == 2 and ref.ppo_micro_batch_size_per_gpu == 2
    assert a.ppo_micro_batch_size is None and ref.ppo_micro_batch_size is None  # verl refuses both set
    # FSDP: strategy (cuda default fsdp = FSDP1) in the actor, its engine, the critic and the reference
    assert (a.strategy, a.engine.strategy, c.strategy, c.engine.strategy, ref.strategy) == ("fsdp",) * 5
    bf16 = {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert dict(a.fsdp_config.mixed_precision) == bf16 and dict(c.engine.mixed_precision) == bf16
    assert dict(ref.fsdp_config.mixed_precision) == bf16
    assert a.fsdp_config.use_torch_compile is True
    assert ref.fsdp_config.param_offload is True  # the reference model is offloaded on cuda
    assert a.fsdp_config.param_offload is False
    m = built["model"]
    assert m.enable_gradient_checkpointing is True
    # no flash-attn on the host
    assert vcfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert vcfg.actor_rollout_ref.model.use_remove_padding is False


@pytest.mark.parametrize("decode", ["dynamic", "static", "compiled"])
def test_decode_reaches_the_hf_servers_config(model_dir, decode):
    """actor_rollout_ref.rollout.decode -> rollout.engine_kwargs.hf.decode (where verl keeps vLLM's and SGLang's
    options), through verl's RolloutConfig, which the hf server reads; the other rollouts get no hf options."""
    _, built = gpu_config(model_dir, "engine.verl.rollout=hf", f"actor_rollout_ref.rollout.decode={decode}")
    assert dict(built["rollout"].engine_kwargs["hf"]) == {"decode": decode}
    _, built = gpu_config(model_dir, "engine.verl.rollout=vllm")
    assert "hf" not in (built["rollout"].engine_kwargs or {})


def test_fsdp2_fp32_and_flash_attn_two_nodes(model_dir):
    """The other values: FSDP2 when asked, fp32 (our default), flash-attn on the host, tp over nodes."""
    vcfg, built = gpu_config(model_dir, "engine.verl.rollout=vllm", "engine.verl.strategy=fsdp2",
                             "trainer.nnodes=2",
                             "engine.verl.rollout_tp=8", "engine.verl.gradient_checkpointing=false",
                             "engine.verl.agent_num_workers=2", "algo=grpo", "micro_batch_size_per_gpu=1",
                             on=host(4, "flash_attn"))
    a, r = built["actor"], built["rollout"]
    assert (a.strategy, a.engine.strategy) == ("fsdp2", "fsdp2")
    assert "critic" not in built and "ref" not in built
    assert dict(a.fsdp_config.mixed_precision) == {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                   "buffer_dtype": "fp32"}
    assert r.dtype == "float32" and r.tensor_model_parallel_size == 8 and r.agent.num_workers == 2
    (replica,) = built["replicas"]  # one engine of 8 GPUs: verl places it on 2 nodes of 4
    assert (replica.world_size, replica.gpus_per_replica_node, replica.nnodes) == (8, 4, 2)
    assert vcfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert vcfg.actor_rollout_ref.model.use_remove_padding is True
    assert built["model"].enable_gradient_checkpointing is False
    assert built["actor"].ppo_micro_batch_size_per_gpu == 1
    # 16 episodes on 8 workers: mini-batches of 8 are 1 row per worker, so micro-batches of 2 are refused
    with pytest.raises(ValueError, match="micro_batch_size_per_gpu=2"):
        gpu_config(model_dir, "engine.verl.rollout=vllm", "trainer.nnodes=2", "algo=grpo")


@pytest.mark.parametrize("overrides,on,match", [
    (["engine.verl.rollout=vllm", "engine.verl.rollout_tp=3"], None, "engine.verl.rollout_tp=3 must divide"),
    (["engine.verl.rollout=vllm", "trainer.nnodes=3", "es_manager.train.env_groups=12",
      "ppo_mini_batch_size=12", "micro_batch_size_per_gpu=1", "engine.verl.rollout_tp=6"], None,
     "rollout_tp=6 spans nodes"),
    (["engine.verl.rollout=vllm", f"{GMU}=1.5"], None, "gpu_memory_utilization=1.5"),
    (["engine.verl.rollout=sglang", f"{GMU}=0"], None, "gpu_memory_utilization=0"),
    (["trainer.n_gpus_per_node=8", "ppo_mini_batch_size=16", "micro_batch_size_per_gpu=1"], "4gpus",
     "trainer.n_gpus_per_node=8 but this machine has 4"),
    (["engine.verl.rollout=vllm"], "no_engines", "vllm is not installed"),
    (["engine.verl.rollout=hf", "engine.verl.rollout_tp=2"], None, "rollout_tp must be 1"),
    ([], "no_gpu", "engine.verl.device=cuda but torch sees no GPU"),
    (["engine.verl.rollout=vllm", "actor_rollout_ref.rollout.decode=static"], None,
     "actor_rollout_ref.rollout.decode=static"),
], ids=["tp_not_dividing", "tp_spanning_part_of_a_node", "gmu_over_1", "gmu_0", "more_gpus_than_the_host",
        "vllm_missing", "hf_tp", "no_gpu", "decode_on_vllm"])
def test_our_gpu_checks_name_the_key(model_dir, overrides, on, match):
    """What verl would stop on mid-start (or Ray would wait on) is refused before any work, naming the key."""
    from ragen_turn.engines.verl.config import Host, check_ragen_config

    hosts = {None: host(), "4gpus": host(), "no_engines": Host(4), "no_gpu": Host(0, ENGINES)}
    with pytest.raises(ValueError, match=match):
        check_ragen_config(micro_config([*NODE, f"model.path={model_dir}", *overrides]), hosts[on])


@pytest.mark.parametrize("raw,err,match", [
    # verl's RolloutConfig.__post_init__
    ({"actor_rollout_ref": {"rollout": {"mode": "sync"}}}, ValueError, "sync"),
    ({"actor_rollout_ref": {"rollout": {"pipeline_model_parallel_size": 2}}}, NotImplementedError,
     "pipeline_model_parallel_size"),
    # verl's ActorConfig.__post_init__ (via validate_config)
    ({"actor_rollout_ref": {"actor": {"ppo_micro_batch_size": 8}}}, ValueError, "ppo_micro_batch_size"),
    # verl's validate_config: check_mutually_exclusive on the rollout's log-prob micro-batches
    ({"actor_rollout_ref": {"rollout": {"log_prob_micro_batch_size": 8}}}, ValueError,
     "log_prob_micro_batch_size"),
    # verl's FSDPEngineConfig.__post_init__ (the actor's fsdp_config)
    ({"actor_rollout_ref": {"actor": {"fsdp_config": {"strategy": "deepspeed"}}}}, AssertionError,
     "deepspeed"),
    # the reference config as verl's actor worker builds it (FSDPActorConfig.__post_init__)
    ({"actor_rollout_ref": {"ref": {"log_prob_micro_batch_size": 8}}}, ValueError, "ref"),
    # engines must tile the workers: verl's data-parallel rollout size multiplies the GPUs per engine
    ({"actor_rollout_ref": {"rollout": {"data_parallel_size": 3}}}, ValueError, "divide the 4 FSDP workers"),
], ids=["rollout_mode_sync", "rollout_pp", "actor_both_micro", "rollout_both_micro", "fsdp_strategy",
        "ref_both_micro", "rollout_dp"])
def test_verls_own_checks_run_on_the_gpu_config(vllm_config, raw, err, match):
    """Raw verl keys (what ``engine.verl.overrides`` would merge) that verl's classes reject on the mapped GPU
    config: check_verl_config runs those classes (the unmodified config passes: the first test)."""
    from omegaconf import OmegaConf

    from ragen_turn.engines.verl.config import check_verl_config

    bad = OmegaConf.merge(vllm_config, OmegaConf.create(raw))
    with pytest.raises(Exception, match=match) as e:
        check_verl_config(bad)
    # hydra's instantiate (omega_conf_to_dataclass) wraps what the dataclass raised
    assert isinstance(e.value, err) or isinstance(e.value.__cause__, err), repr(e.value)


@pytest.fixture(scope="module")
def vllm_config(model_dir):
    from ragen_turn.engines.verl.config import to_verl_config

    cfg = micro_config([*NODE, f"model.path={model_dir}", "engine.verl.rollout=vllm", "algo=turn_ppo",
                        "actor_rollout_ref.actor.use_kl_loss=true"])
    return to_verl_config(cfg, host=host())


def test_check_command_maps_for_the_named_host(model_dir, capsys):
    """``python -m ragen_turn.engines.verl.check``: a GPU config checked on this CPU, for a named machine."""
    from ragen_turn.engines.verl.check import main

    common = [o for o in NODE if o != "engine=verl"] + [f"model.path={model_dir}", "engine.verl.rollout=vllm"]
    assert main(["--gpus", "4", "--installed", "vllm", *common, "engine.verl.rollout_tp=2"]) == 0
    out = capsys.readouterr().out
    want = "rollout.name=vllm tensor_model_parallel_size=2 gpu_memory_utilization=0.5 dtype=float32 engines=2"
    assert want in out
    assert "actor.strategy=fsdp " in out and "checks passed" in out
    assert main(["--gpus", "4", "--installed", "vllm", *common, "engine.verl.rollout_tp=3"]) == 2
    assert "engine.verl.rollout_tp=3" in capsys.readouterr().err
    assert main(["--gpus", "4", "--installed", "vllm,tgi", *common]) == 2


def test_hf_server_samples_on_its_workers_gpu():
    """The hf rollout on a GPU machine: each server on its actor worker's GPU, as the server numbers it."""
    from ragen_turn.engines.verl.hf_rollout import server_device

    assert server_device(["0"], None, cuda=False) == "cpu"  # the CPU platform: a logical Ray GPU slot
    assert server_device([], None, cuda=True) == "cpu"
    assert server_device(["3"], None, cuda=True) == "cuda:3"
    assert server_device(["3"], "2,3", cuda=True) == "cuda:1"  # the node was started with 2 GPUs visible
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=0,1"):
        server_device(["3"], "0,1", cuda=True)
