"""config/sweep/ and config/paper/: each composes, --multirun expands to the right jobs with distinct run dirs,
the papers' values are the SPEC's. No training: jobs are composed, checked and counted, never run."""
from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from ragen_turn.sweeps import sweep_jobs
from ragen_turn.compose import CONFIG_DIR, compose_config

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "config"  # an existing directory standing in for model.path (configs are only composed here)
SWEEPS = {  # name -> (overrides as documented in the sweep file, jobs)
    "algos": (["env=sokoban", "+sweep=algos"], 30),
    "compare": (["env=sokoban", "+setting=long_horizon", "+sweep=compare"], 35),
    "gamma_lambda": (["env=sokoban", "algo=turn_ppo", "+sweep=gamma_lambda"], 48),
    "batch_design": (["env=sokoban", "algo=turn_ppo", "+sweep=batch_design"], 48),
    "critic_lr": (["env=sokoban", "algo=turn_ppo", "+sweep=critic_lr"], 12),
}
PAPERS = ["turnppo_webshop_qwen2.5-3b", "turnppo_webshop_qwen3-1.7b", "turnppo_webshop_qwen3-1.7b-think",
          "turnppo_sokoban_qwen2.5-3b", "turnppo_sokoban_qwen2.5-7b"]
STPPO_PAPERS = ["stppo_search_qa_qwen2.5-7b", "stppo_search_qa_qwen2.5-1.5b", "stppo_medqa_qwen2.5-7b"]
SQA_DATA = ROOT / "envs" / "search_qa" / "data"  # stand-ins for the user's files (the schema checks they exist)
STPPO_DATA = [f"paper_data.corpus_path={SQA_DATA / 'corpus.jsonl.gz'}",
              f"paper_data.train_path={SQA_DATA / 'train.jsonl.gz'}",
              f"paper_data.val_path={SQA_DATA / 'val.jsonl.gz'}"]
ALGOS = sorted(p.stem for p in (ROOT / "config" / "algo").glob("*.yaml"))  # the sweep lists them all (issue #59)


def test_every_sweep_and_paper_file_is_tested():
    assert sorted(p.stem for p in (ROOT / "config" / "sweep").glob("*.yaml")) == sorted(SWEEPS)
    assert sorted(p.stem for p in (ROOT / "config" / "paper").glob("*.yaml")) == sorted(
        PAPERS + ["turnppo_common"] + STPPO_PAPERS + ["stppo_common"])


def test_cfg_job_composes_on_the_command_line():
    """``python -m ragen_turn.train ... --cfg job`` for every sweep and one paper config (run side by side; the
    other paper configs are composed in-process below, as --cfg job does)."""
    cmds = [[*SWEEPS[s][0], "--cfg", "job"] for s in SWEEPS]
    cmds += [[f"+paper={PAPERS[2]}", f"model.path={MODEL_DIR}", "--cfg", "job", "--resolve"]]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "ragen_turn.train", *c], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for c in cmds]
    for c, p in zip(cmds, procs):
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, (c, out)
        assert "trainer:" in out and "experiment_name:" in out, (c, out)


@functools.lru_cache(maxsize=None)
def _jobs(*overrides):
    return sweep_jobs(list(overrides))


def _compose_jobs(jobs):
    """The resolved config of each job. Hydra composes once per distinct choice of config groups; a plain key
    override (``algorithm.gamma=0.9``) is then applied as Hydra applies it, by setting the key (cheaper)."""
    parser = OverridesParser.create()
    composed, out = {}, []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for job in jobs:
            parsed = parser.parse_overrides(list(job))
            groups = tuple(o.input_line for o in parsed if o.is_add() or o.key_or_group in ("env", "algo", "model",
                                                                                             "engine"))
            if groups not in composed:
                composed[groups] = compose(config_name="base", overrides=list(groups))
            cfg = copy.deepcopy(composed[groups])
            for o in parsed:
                if o.input_line not in groups:
                    OmegaConf.update(cfg, o.key_or_group, o.value(), force_add=False)
            OmegaConf.resolve(cfg)
            out.append(cfg)
    return out


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_sweep_expands_to_distinct_valid_jobs(name):
    from ragen_turn.config import validate_config

    overrides, n_jobs = SWEEPS[name]
    jobs = _jobs(*overrides)
    assert len(jobs) == n_jobs
    assert len({tuple(sorted(j)) for j in jobs}) == n_jobs
    seeds = 5 if name == "compare" else 3  # the comparison of results/: 5 seeds per algorithm
    assert sorted({j for job in jobs for j in job if j.startswith("seed=")}) == [f"seed={i}" for i in range(seeds)]
    cfgs = _compose_jobs(jobs)
    dirs = set()
    for cfg in cfgs:
        # every job passes the trainer's config checks: a refused job would stop the whole --multirun
        cfg.device = "cpu"
        validate_config(cfg)
        d = str(cfg.trainer.default_local_dir)
        prefix = "runs/compare/" if name == "compare" else f"runs/sweep_{name}/"
        assert d.startswith(prefix) and d.endswith(f"_s{cfg.seed}"), d
        dirs.add(d)
    assert len(dirs) == n_jobs
    # one job composed by Hydra from scratch is the same config
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        full = compose(config_name="base", overrides=list(jobs[-1]))
    OmegaConf.resolve(full)
    full.device = "cpu"
    assert full == cfgs[-1]
    cfgs = [c for c in cfgs if c.seed == 0]

    # the swept values
    if name == "algos":
        assert sorted(c.algo.name for c in cfgs) == sorted(ALGOS)
    elif name == "gamma_lambda":
        assert sorted({c.algorithm.gamma for c in cfgs}) == [0.9, 0.95, 0.99, 1.0]
        assert sorted({c.algorithm.lam for c in cfgs}) == [0.8, 0.9, 0.95, 1.0]
        assert all(c.algo.name == "turn_ppo" for c in cfgs) and len(cfgs) == 16
    elif name == "batch_design":
        shapes = {(c.es_manager.train.env_groups, c.es_manager.train.group_size) for c in cfgs}
        assert shapes == {(64, 1), (32, 2), (16, 4), (8, 8)}
        assert sorted({c.ppo_mini_batch_size for c in cfgs}) == [16, 64]
        assert sorted({c.ppo_epochs for c in cfgs}) == [1, 4]
    elif name == "critic_lr":
        ratios = sorted(round(c.critic.optim.lr / c.actor_rollout_ref.actor.optim.lr, 6) for c in cfgs)
        assert ratios == [1, 5, 10, 50]


def test_sweep_lists_can_be_narrowed_on_the_command_line():
    # train.sh passes algo=...: a list there replaces the sweep's; grpo drops the G = 1 shape
    assert len(_jobs("env=sokoban", "algo=" + ",".join(ALGOS), "+sweep=algos")) == 30
    assert len(_jobs("env=sokoban", "algo=turn_ppo", "+sweep=algos")) == 3
    grpo = _jobs("env=sokoban", "algo=grpo", "+sweep=batch_design", "+sweep/batch_shape=br32_g2,br16_g4,br8_g8")
    assert len(grpo) == 36 and not any("+sweep/batch_shape=br64_g1" in j for j in grpo)


def _basic_sweeper_jobs(overrides):
    """Reference: the jobs as Hydra's own basic sweeper splits them (its internal API, for this test only), from
    the params of the config Hydra composes for --multirun."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        hcfg = GlobalHydra.instance().hydra.compose_config(config_name="base", overrides=list(overrides),
                                                           run_mode=RunMode.MULTIRUN)
    parser = OverridesParser.create()
    params = [f"{k}={v}" for k, v in (hcfg.hydra.sweeper.params or {}).items()]
    task = [o.input_line for o in parser.parse_overrides(list(overrides)) if not o.is_hydra_override()]
    return [list(j) for batch in BasicSweeper.split_arguments(parser.parse_overrides(params + task), None)
            for j in batch]


@pytest.mark.parametrize("overrides", [
    ("env=sokoban", "algo=turn_ppo", "+sweep=gamma_lambda"),
    ("env=sokoban", "algo=grpo,turn_ppo", "+sweep=algos", "seed=1"),           # the command line narrows the sweep
    ("env=sokoban", "algo=turn_ppo", "algorithm.gamma=0.9,0.99", "seed=0,1,2", "algorithm.lam=0.95",
     "hydra.job.chdir=false"),                                                   # no sweep file; a hydra override
    ("env=sokoban", "algo=grpo", "+sweep=batch_design", "+sweep/batch_shape=br32_g2,br16_g4"),
])
def test_sweep_jobs_are_hydras(overrides):
    assert sweep_jobs(list(overrides)) == _basic_sweeper_jobs(overrides)


def _listed(capsys, *overrides):
    from ragen_turn.sweeps import list_jobs

    rc = list_jobs(list(overrides), validate=False)
    lines = capsys.readouterr().out.splitlines()
    return rc, [ln.split()[1] for ln in lines[:-1]], lines[-1]


def test_list_jobs_names_the_run_dirs_and_the_collisions(capsys):
    rc, dirs, summary = _listed(capsys, "env=sokoban", "algo=turn_ppo", "+sweep=critic_lr")
    assert rc == 0 and summary == "12 jobs, 12 distinct run dirs" and len(set(dirs)) == 12
    rc, dirs, summary = _listed(capsys, "env=sokoban", "seed=0,1", "trainer.default_local_dir=runs/one")
    assert rc == 1 and dirs == ["runs/one", "runs/one"] and summary == "2 jobs, 1 distinct run dirs, 1 problems"


def test_list_jobs_on_the_command_line():
    """``report --list-jobs`` (the documented command) and ``python -m ragen_turn.sweeps`` print the same jobs,
    and a refused config is named with its key."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["env=sokoban", "algo=turn_ppo", "algorithm.lam=0.9,2.0"]
    outs = [subprocess.run([sys.executable, "-m", mod, *flag, *args], cwd=ROOT, env=env, text=True,
                           capture_output=True, timeout=120)
            for mod, flag in (("ragen_turn.report", ["--list-jobs"]), ("ragen_turn.sweeps", []))]
    for out in outs:
        assert out.returncode == 1, out.stderr
        lines = out.stdout.splitlines()
        assert lines[-1] == "2 jobs, 2 distinct run dirs, 1 problems"
        assert "INVALID" not in lines[0] and "INVALID" in lines[1] and "algorithm.lam" in lines[1]
    assert outs[0].stdout == outs[1].stdout


def test_multirun_launches_each_job_in_its_own_run_dir(tmp_path, capsys):
    """The real --multirun path (Hydra's basic sweeper and launcher) with a task that only records its config,
    arguments in train.sh's order (``env= algo= +sweep=... --multirun``)."""
    script = tmp_path / "task.py"
    script.write_text(
        "import hydra\n"
        "from ragen_turn.compose import CONFIG_DIR\n"
        "@hydra.main(config_path=CONFIG_DIR, config_name='base', version_base='1.3')\n"
        "def main(cfg):\n"
        "    from hydra.core.hydra_config import HydraConfig\n"
        "    print('JOB', cfg.trainer.default_local_dir, cfg.critic.optim.lr, HydraConfig.get().runtime.output_dir)\n"
        "main()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script), "env=sokoban", "algo=turn_ppo", "+sweep=critic_lr", "seed=0",
                          "--multirun"], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    jobs = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("JOB")]
    assert len(jobs) == 4
    assert len({j[1] for j in jobs}) == 4
    from ragen_turn.compose import compose_config
    actor_lr = compose_config(["env=sokoban", "algo=turn_ppo"]).actor_rollout_ref.actor.optim.lr
    for _, run_dir, _, hydra_dir in jobs:
        assert run_dir.startswith(f"runs/sweep_critic_lr/sokoban_turn_ppo_tiny_alr{actor_lr}_clr")
        assert Path(hydra_dir) == tmp_path / run_dir / "hydra"  # Hydra's job files sit inside the run dir
    assert (tmp_path / "runs" / "sweep_critic_lr" / "multirun.yaml").is_file()
    # the run dirs that the listing gives are the ones the real --multirun used, here and where the run name takes
    # the swept key from the command line (no sweep file: the default experiment_name's override suffix)
    from ragen_turn.sweeps import list_jobs

    for args in (["env=sokoban", "algo=turn_ppo", "+sweep=critic_lr", "seed=0"],
                 ["env=sokoban", "algo=turn_ppo", "algorithm.gamma=0.9,0.99", "seed=0"]):
        out = subprocess.run([sys.executable, str(script), *args, "--multirun"], cwd=tmp_path, env=env, text=True,
                             capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr
        real = sorted(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("JOB"))
        list_jobs(args, validate=False)
        listed = sorted(ln.split()[1] for ln in capsys.readouterr().out.splitlines()[:-1])
        assert listed == real and len(set(real)) == len(real) > 1, (listed, real)


# ------------------------------------------------------------------------------------------------ paper configs
@functools.lru_cache(maxsize=None)
def _paper(name, *extra):
    return compose_config([f"+paper={name}", f"model.path={MODEL_DIR}", *extra])


@pytest.mark.parametrize("name", PAPERS)
def test_paper_config_has_the_spec_values(name):
    from ragen_turn.config import validate_config

    cfg = _paper(name)
    a = cfg.actor_rollout_ref.actor
    assert cfg.engine.name == "verl" and cfg.algo.name == "turn_ppo"
    assert cfg.env.name == name.split("_")[1]
    assert (a.optim.lr, cfg.critic.optim.lr) == (1e-6, 1e-5)
    assert (cfg.algorithm.gamma, cfg.algorithm.lam) == (0.99, 0.9)
    assert (a.clip_ratio_low, a.clip_ratio_high, a.entropy_coeff) == (0.2, 0.28, 0.001)
    assert a.use_kl_loss and a.kl_loss_coef == 0.001
    assert a.policy_loss.ratio_mode == "sum"
    assert cfg.actor_rollout_ref.rollout.response_length == 400
    assert cfg.agent_proxy.max_turn == (9 if cfg.env.name == "webshop" else 5)
    assert cfg.agent_proxy.enable_think == name.endswith("-think")
    assert cfg.trainer.total_training_steps == 200
    assert cfg.es_manager.train.group_size == 1 and cfg.es_manager.train.env_groups >= 64  # G = 1, many prompts
    assert cfg.dtype == "bfloat16"
    # token-PPO baseline: gamma = lam = 1
    tok = _paper(name, "algo=token_ppo")
    assert (tok.algorithm.gamma, tok.algorithm.lam) == (1.0, 1.0) and tok.actor_rollout_ref.actor.optim.lr == 1e-6
    # the local checks pass, and verl's batching can split the batch over the GPUs
    for c in (cfg, tok):
        c.device = "cpu"
        validate_config(c)
        kept, bm = c.es_manager.train.env_groups * c.es_manager.train.group_size, c.ppo_mini_batch_size
        assert kept % bm == 0 and bm % (c.trainer.n_gpus_per_node * c.trainer.nnodes) == 0


@pytest.mark.parametrize("name", STPPO_PAPERS)
def test_stppo_paper_config_has_the_spec_values(name):
    from ragen_turn.config import validate_config

    cfg = _paper(name, *STPPO_DATA)
    a, sq = cfg.actor_rollout_ref.actor, cfg.custom_envs.SearchQA.env_config
    assert cfg.engine.name == "verl" and cfg.algo.name == "st_ppo" and cfg.env.name == "search_qa"
    assert cfg.algorithm.adv_estimator == "token_gae" and cfg.critic.level == "token"  # (paper) critic + token GAE
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.2, 0.2)                           # (paper) clip eps 0.2
    assert (cfg.algorithm.gamma, cfg.algorithm.lam) == (1.0, 1.0)
    assert (a.optim.lr, cfg.critic.optim.lr, a.kl_loss_coef) == (1e-6, 1e-5, 0.001)      # Search-R1's defaults
    assert cfg.actor_rollout_ref.rollout.response_length == 500 and cfg.agent_proxy.max_turn == 5
    assert (sq.topk, sq.max_searches, sq.corpus_path) == (3, 4, str(SQA_DATA / "corpus.jsonl.gz"))
    assert cfg.custom_envs.SearchQAVal.env_config.corpus_path == str(SQA_DATA / "corpus.jsonl.gz")
    assert (sq.qa_path, cfg.custom_envs.SearchQAVal.env_config.qa_path) == (str(SQA_DATA / "train.jsonl.gz"),
                                                                          str(SQA_DATA / "val.jsonl.gz"))
    assert cfg.custom_envs.SearchQAVal.env_config.max_turns == 5
    assert sq.qa_format == ("mcqa" if "medqa" in name else "auto")
    assert cfg.model.name == ("qwen2.5-1.5b" if "1.5b" in name else "qwen2.5-7b") and cfg.dtype == "bfloat16"
    cfg.device = "cpu"
    validate_config(cfg)
    kept, bm = cfg.es_manager.train.env_groups * cfg.es_manager.train.group_size, cfg.ppo_mini_batch_size
    assert kept % bm == 0 and bm % (cfg.trainer.n_gpus_per_node * (cfg.trainer.nnodes or 1)) == 0
    no_corpus = compose_config([f"+paper={name}", "model.path=/m", *STPPO_DATA[1:]])
    no_corpus.device = "cpu"
    with pytest.raises(ValueError, match=r"paper_data\.corpus_path is required"):
        validate_config(no_corpus)  # the data paths must be given, before any work


def test_paper_runs_have_distinct_dirs_and_need_a_model_path():
    dirs = {str(_paper(p).trainer.default_local_dir) for p in PAPERS}
    assert len(dirs) == len(PAPERS) and all(d.startswith("runs/paper/") for d in dirs)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="base", overrides=[f"+paper={PAPERS[0]}"])
    assert OmegaConf.is_missing(cfg.model, "path")


def test_paper_configs_only_set_existing_keys():
    """Every key the paper files set exists in the config they override (base + groups, engine=verl)."""
    missing = object()
    bases = {env: compose_config(["engine=verl", f"model.path={MODEL_DIR}", f"env={env}"])
             for env in ("sokoban", "search_qa")}

    def leaves(node, prefix=""):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                yield from leaves(v, key + ".")
            else:
                yield key

    for path in sorted((ROOT / "config" / "paper").glob("*.yaml")):
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        data.pop("defaults", None)
        base = bases["search_qa" if path.stem.startswith("stppo") else "sokoban"]
        for key in leaves(data):
            if key.startswith("paper_data."):  # the ST-PPO files' own required data paths
                continue
            assert OmegaConf.select(base, key, default=missing) is not missing, f"{path.name}: {key}"
    common = (ROOT / "config" / "paper" / "turnppo_common.yaml").read_text()
    assert "UNCONFIRMED" in next(ln for ln in common.splitlines() if "kl_loss_coef" in ln)
    for p in PAPERS + STPPO_PAPERS:
        assert f"python -m ragen_turn.train +paper={p}" in (ROOT / "config" / "paper" / f"{p}.yaml").read_text()


@pytest.mark.parametrize("runs, expected", [
    ({"ALGOS": "grpo turn_ppo", "SEEDS": "3 4"}, ["grpo s3", "grpo s4", "turn_ppo s3", "turn_ppo s4"]),
    ({"ALGOS": "grpo turn_ppo", "SEEDS": "3 4", "RUNS": "st_ppo:1 grpo:4"}, ["grpo s4", "st_ppo s1"]),
])
def test_compare_script_starts_no_run_past_its_deadline(tmp_path, runs, expected):
    """scripts/compare.sh with DEADLINE less than MIN_RUN_S away: the shared warm start is still made (here: the
    committed long_turns one, copied), and each run (ALGOS x SEEDS, or the RUNS list instead) is logged as not
    started; no run directory is made."""
    env = {**os.environ, "RAGEN_TURN_RUNS_DIR": str(tmp_path / "runs"), "RAGEN_TURN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHON": sys.executable, "PARALLEL": "2", "DEADLINE": str(int(time.time()) + 100), "MIN_RUN_S": "600",
           **runs}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "compare.sh"), "long_turns"], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert out.returncode == 0, out.stdout
    assert "copied the committed warmstart" in out.stdout, out.stdout
    rows = (tmp_path / "runs" / "compare" / "walltimes_long_turns.tsv").read_text().splitlines()
    assert sorted(r.split(" (")[0] for r in rows) == expected, rows
    assert all("not started" in r and "to DEADLINE" in r for r in rows), rows
    assert not any(p.is_dir() for p in (tmp_path / "runs" / "compare").iterdir())


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None, reason="this machine has CUDA MPS")
def test_compare_script_with_mps_and_no_mps_control_stops_before_any_work(tmp_path):
    """MPS=1 where nvidia-cuda-mps-control is missing: exit 2 with the reason, before the warm start or any run dir."""
    env = {**os.environ, "RAGEN_TURN_RUNS_DIR": str(tmp_path / "runs"), "RAGEN_TURN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHON": sys.executable, "MPS": "1"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "compare.sh"), "long_turns"], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert out.returncode == 2 and "nvidia-cuda-mps-control not found" in out.stdout, out.stdout
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


def test_the_usage_doc_sweep_lines_run_what_they_say():
    """issue #59: docs/usage.md's `bash train.sh sokoban turn_ppo +sweep=algos --multirun   # the 8 algorithms x 3
    seeds` ran 3 jobs (train.sh's algo replaces the sweep's list), and the sweep listed 8 of the 10 algorithms.
    Each +sweep=algos line of the doc is expanded here and must give what its comment says."""
    import re
    import shlex

    lines = [ln for ln in (ROOT / "docs" / "usage.md").read_text().splitlines() if "+sweep=algos" in ln]
    assert len(lines) == 2, lines
    for line in lines:
        command, _, said = line.partition("#")
        words = shlex.split(command)
        if words[:2] == ["bash", "train.sh"]:
            overrides = [f"env={words[2]}", f"algo={words[3]}", *words[4:]]
        else:
            overrides = words[3:]
        jobs = _jobs(*[w for w in overrides if w not in ("--multirun", "-m")])
        algos = sorted({o.split("=", 1)[1] for j in jobs for o in j if o.startswith("algo=")})
        m = re.search(r"the (\d+) algorithms x (\d+) seeds \((\d+) runs\)", said)
        if m:
            assert algos == ALGOS and len(ALGOS) == int(m.group(1)) == 10, (line, algos)
            assert len(jobs) == int(m.group(3)) == int(m.group(1)) * int(m.group(2)), line
        else:
            assert re.search(r"(\w+) x (\d+) seeds", said).groups() == (algos[0], str(len(jobs))) and len(algos) == 1
