"""Bad command lines for ``bash train.sh sokoban turn_ppo <overrides>`` and the key each error must name.

Used by tests/test_config_schema.py (every case, through the train command's own Hydra app) and by
benchmarks/bench_bad_configs.py (every case through the real command line, timed: the table in
docs/reliability.md). Issue #18's cases come first, in its order. ``VERL_CASES`` need verl installed
(tests/test_verl.py runs them; the benchmark through train.sh, which picks .venv-verl).
"""

# (overrides, text the error must contain: the key, or what names the problem)
CASES = [
    # issue 18, item 4: found after expensive work before
    (["actor_rollout_ref.rollout.temperature=-1"], "actor_rollout_ref.rollout.temperature"),
    (["actor_rollout_ref.actor.clip_ratio_low=-0.2"], "actor_rollout_ref.actor.clip_ratio_low"),
    (["actor_rollout_ref.actor.policy_loss.token_clip_low=1.0"], "actor_rollout_ref.actor.policy_loss.token_clip_low"),
    (["es_manager.format_penalty=abc"], "es_manager.format_penalty"),
    (["es_manager.format_penalty=-inf"], "es_manager.format_penalty"),
    (["actor_rollout_ref.actor.optim.lr=-1"], "actor_rollout_ref.actor.optim.lr"),
    (["actor_rollout_ref.rollout.top_p=0"], "actor_rollout_ref.rollout.top_p"),
    (["critic.optim.lr=abc"], "critic.optim.lr"),
    (["trainer.save_freq=-1"], "trainer.save_freq"),
    # item 5: wrong types
    (["ppo_epochs=abc"], "ppo_epochs"),
    (["trainer.total_training_steps=abc"], "trainer.total_training_steps"),
    (["seed=abc"], "seed"),
    (["dtype=float64"], "dtype"),
    # item 8: a read-only run dir (/sys refuses mkdir even to root)
    (["trainer.default_local_dir=/sys/ragen_turn_run"], "trainer.default_local_dir"),
    # more: typos, ranges, finiteness, batch shapes, paths, choices, env configs, cross-key rules
    (["+algorithm.gama=0.9"], "algorithm.gama"),
    (["algorithm.gama=0.9"], "algorithm.gama"),
    (["+trainer.save_frequency=5"], "trainer.save_frequency"),
    (["actor_rollout_ref.actor.optim.lr=nan"], "actor_rollout_ref.actor.optim.lr"),
    (["actor_rollout_ref.actor.optim.lr=inf"], "actor_rollout_ref.actor.optim.lr"),
    (["actor_rollout_ref.rollout.top_p=1.5"], "actor_rollout_ref.rollout.top_p"),
    (["actor_rollout_ref.rollout.decode=fast"], "actor_rollout_ref.rollout.decode"),
    (["actor_rollout_ref.rollout.temperature=0"], "actor_rollout_ref.rollout.temperature"),
    (["actor_rollout_ref.actor.clip_ratio_high=-1"], "actor_rollout_ref.actor.clip_ratio_high"),
    (["actor_rollout_ref.actor.optim.betas=[0.9,1.0]"], "actor_rollout_ref.actor.optim.betas"),
    (["actor_rollout_ref.actor.kl_loss_coef=-0.1"], "actor_rollout_ref.actor.kl_loss_coef"),
    (["algorithm.gamma=1.5"], "algorithm.gamma"),
    (["algorithm.lam=-0.1"], "algorithm.lam"),
    (["trainer.test_freq=-2"], "trainer.test_freq"),
    (["trainer.keep_checkpoints=-1"], "trainer.keep_checkpoints"),
    (["trainer.max_nonfinite_steps=0"], "trainer.max_nonfinite_steps"),
    (["trainer.time_budget_s=0"], "trainer.time_budget_s"),
    (["trainer.total_training_steps=1.5"], "trainer.total_training_steps"),
    (["ppo_epochs=0"], "ppo_epochs"),
    (["ppo_mini_batch_size=24"], "ppo_mini_batch_size"),
    (["ppo_mini_batch_size=512"], "ppo_mini_batch_size"),
    (["micro_batch_size_per_gpu=0"], "micro_batch_size_per_gpu"),
    (["es_manager.train.group_size=0"], "es_manager.train.group_size"),
    (["es_manager.format_penalty=0.5"], "es_manager.format_penalty"),
    (["device=tpu"], "device"),
    (["model.path=/nonexistent/model"], "model.path"),
    (["model=hf"], "model.path"),
    (["model.warmstart.enable=maybe"], "model.warmstart.enable"),
    (["model.num_attention_heads=3"], "model.num_attention_heads"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=ppo2"], "actor_rollout_ref.actor.policy_loss.loss_mode"),
    (["agent_proxy.reward_normalization.method=zscore"], "agent_proxy.reward_normalization.method"),
    (["critic.level=token"], "critic.level"),
    (["critic.cliprange_value=0"], "critic.cliprange_value"),
    (["+custom_envs.SimpleSokoban.env_config.box_count=2"], "custom_envs.SimpleSokoban.env_config"),
    (["custom_envs.SimpleSokoban.env_config.num_boxes=0"], "custom_envs.SimpleSokoban.env_config"),
    (["env=webshop", "custom_envs.WebShop.env_config.data_dir=/nonexistent/webshop"],
     "custom_envs.WebShop.env_config"),
    (["env=sokobann"], "env"),
    (["algo=grpo", "es_manager.train.group_size=1", "ppo_mini_batch_size=16"], "es_manager.train.group_size"),
    (["trainer.resume=true", "trainer.resume_from=step_000009"], "trainer.resume_from"),
    (["trainer.validation_steps=5"], "trainer.validation_steps"),  # was seed.val=5, accepted as unused since #49
    # keys merged after the schema: algorithm wiring, validation seeds, warm start, search QA, the papers' data
    (["actor_rollout_ref.actor.clip_ratio_c=0.5"], "actor_rollout_ref.actor.clip_ratio_c"),
    (["actor_rollout_ref.actor.policy_loss.clip_bias_stat=foo"], "actor_rollout_ref.actor.policy_loss.clip_bias_stat"),
    (["actor_rollout_ref.actor.policy_loss.clip_bias_threshold=-1"],
     "actor_rollout_ref.actor.policy_loss.clip_bias_threshold"),
    (["actor_rollout_ref.actor.max_update_kl=0"], "actor_rollout_ref.actor.max_update_kl"),
    (["algo=grpo", "algorithm.bootstrap_truncated=true"], "algorithm.bootstrap_truncated"),
    (["algorithm.bi_level_gae_turn_ends=foo"], "algorithm.bi_level_gae_turn_ends"),
    (["trainer.collapse_num_samples=1"], "trainer.collapse_num_samples"),
    (["es_manager.val.seeds=foo"], "es_manager.val.seeds"),
    (["model.warmstart.think=foo"], "model.warmstart.think"),
    (["model.warmstart.actions_per_turn=[0]"], "model.warmstart.actions_per_turn"),
    (["model.warmstart.fit_turn_budget=maybe"], "model.warmstart.fit_turn_budget"),
    (["+setting=nope"], "setting/nope"),
    (["env_module=nonexistent_env_module"], "env_module"),
    (["es_manager.train.env_configs.n_groups=[3]"], "es_manager.train.env_configs.n_groups"),
    (["env=search_qa", "custom_envs.SearchQA.env_config.topk=0"], "custom_envs.SearchQA.env_config"),
    (["env=search_qa", "custom_envs.SearchQA.env_config.corpus_path=/nonexistent/wiki-18.jsonl"],
     "custom_envs.SearchQA.env_config"),
    (["env=search_qa", "custom_envs.SearchQAVal.env_config.qa_path=/nonexistent/test.parquet"],
     "custom_envs.SearchQAVal.env_config"),
    (["+paper=stppo_search_qa_qwen2.5-1.5b", "model.path=.", "paper_data.corpus_path=/nonexistent/wiki-18.jsonl",
      "paper_data.train_path=/nonexistent/train.parquet", "paper_data.val_path=/nonexistent/test.parquet"],
     "paper_data.corpus_path"),
]

# engine=verl: its own rules run in the same check (verl must be installed: train.sh picks .venv-verl)
VERL_CASES = [
    (["engine=verl", "actor_rollout_ref.actor.policy_loss.clip_bias=true",
      "actor_rollout_ref.actor.policy_loss.clip_bias_level=batch", "micro_batch_size_per_gpu=2"],
     "actor_rollout_ref.actor.policy_loss.clip_bias_level"),
    (["engine=verl", "micro_batch_size_per_gpu=3"], "micro_batch_size_per_gpu"),
    (["engine=verl", "engine.verl.device=tpu"], "engine.verl.device"),
    (["engine=verl", "trainer.time_budget_s=60"], "trainer.time_budget_s"),          # local-engine keys: said before
    (["engine=verl", "algorithm.bootstrap_truncated=true"], "algorithm.bootstrap_truncated"),  # the warm start too
    (["engine=verl", "actor_rollout_ref.actor.max_update_kl=0.1"], "actor_rollout_ref.actor.max_update_kl"),
    (["engine=verl", "critic.head_init=fit"], "critic.head_init"),
]
