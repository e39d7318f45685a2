"""The verl engine: Ray + FSDP workers + an agent loop, verl 0.9.1 (GPUs, or CPU with a transformers rollout).

``bash train.sh sokoban turn_ppo engine=verl`` ends in :func:`launch` (:mod:`.launch`, re-exported here with the
install check, the config build and the failure report). Importing this package never imports verl (so
``import ragen_turn`` works without it); :func:`launch` does, and says how to install it when it is missing.

Modules (each imports verl): :mod:`.config` (our Hydra keys -> verl's config, device placement and
every check), :mod:`.register` (our policy losses and ``turn_gae`` in verl's registries),
:mod:`.agent_loop` (the verl agent loop that plays our environments turn by turn), :mod:`.losses`
(the actor loss with turn counts), :mod:`.trainer` (``VerlStarPOTrainer`` on verl's
``RayPPOTrainer``, ``TaskRunner``), :mod:`.cpu_platform` (verl's platform registry: ``cpu``),
:mod:`.workers` (verl's workers on a gloo process group), :mod:`.hf_rollout` (the ``hf`` rollout in
verl's rollout registries), :mod:`.value_model` (the critic loader without flash-attn or trl),
:mod:`.token_logprobs` (the actor's token log-probs without flash-attn, by chunks of rows), :mod:`.replace` (how
those two put theirs in place of verl's functions). See docs/verl.md.
"""
from __future__ import annotations

from .launch import (INSTALL_HINT, VERL_VERSION, VerlNotInstalled, build_verl_config, check_config, launch,
                     model_path_for_verl, private_tmpdir, require_verl, resume_command, run_failure, what_died)
