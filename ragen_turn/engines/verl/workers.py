"""verl's FSDP workers as the verl engine runs them on CPU: a plain ``gloo`` process group first.

verl's ``initialize_global_process_group_ray`` (called by its ``TrainingWorker``) asks torch for the
backend ``cpu:gloo,<device>:<backend>``, which torch rejects when the device is ``cpu`` as well.
These subclasses open the default group with ``gloo`` before verl's constructor runs; verl then
finds it initialised and uses it. Nothing else changes: the classes are verl's ``TrainingWorker``
(actor, reference, critic) and ``ActorRolloutRefWorker``, whose ``actor_worker_cls`` /
``ref_worker_cls`` attributes are verl's own hook for the inner workers. The verl engine's
``TaskRunner`` maps the roles to them when the platform is CPU (see :mod:`.cpu_platform`).
"""
from __future__ import annotations

import torch
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker


def init_gloo_process_group() -> None:
    """Open this worker's default process group with plain ``gloo`` (no-op when one exists)."""
    if not torch.distributed.is_initialized():
        initialize_global_process_group_ray(timeout_second=None, backend="gloo")


class GlooTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` (actor, reference or critic) on a plain gloo process group."""

    def __init__(self, config):
        init_gloo_process_group()
        super().__init__(config)


class GlooActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor/rollout/reference worker whose inner workers use gloo."""

    actor_worker_cls = GlooTrainingWorker
    ref_worker_cls = GlooTrainingWorker

    def __init__(self, *args, **kwargs):
        init_gloo_process_group()
        super().__init__(*args, **kwargs)
