"""The jobs of a Hydra sweep, listed without training: ``python -m ragen_turn.sweeps OVERRIDES...``
(also ``python -m ragen_turn.report --list-jobs OVERRIDES...``).

``python -m ragen_turn.sweeps env=sokoban algo=turn_ppo +sweep=gamma_lambda`` prints the 48 jobs that
``python -m ragen_turn.train --multirun`` with the same overrides launches, each job's run directory, and any job
whose config would be refused (``--no-check``: skip the config checks).

Expansion as Hydra's basic sweeper does it: the sweep file's ``hydra.sweeper.params`` first, then the command
line's overrides (a key given twice keeps its first place and its last value), and every combination of the
swept values (``a=1,2``) in that order. Each job's config is composed by :func:`ragen_turn.compose.compose_config`,
the same pipeline a run goes through (RAGEN's keys mapped, ``env_module`` imported, the run name's override
suffix); its checks run after the run directory is read, on ``device=cpu`` (a GPU sweep lists on any machine).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from typing import Dict, List, Optional, Sequence


def _parse(overrides: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def sweep_jobs(overrides: Sequence[str]) -> List[List[str]]:
    """The jobs (override lists) that ``python -m ragen_turn.train --multirun OVERRIDES`` launches."""
    from ragen_turn.compose import compose_with_hydra

    parsed = _parse(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]  # Hydra composes a sweep without them too
    params = compose_with_hydra(fixed).hydra.sweeper.params or {}
    task = [o.input_line for o in parsed if not o.is_hydra_override()]
    choices: Dict[str, List[str]] = {}
    for o in _parse([f"{k}={v}" for k, v in params.items()] + task):
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise ValueError(f"{o.input_line}: only lists of values (a=1,2) can be swept here, as by Hydra's "
                             "basic sweeper")
    return [list(job) for job in itertools.product(*choices.values())]


def list_jobs(overrides: Sequence[str], validate: bool = True) -> int:
    """Print one line per job (index, run dir, overrides, problems) and a summary; 1 if any job has a problem
    (a run dir shared with an earlier job, or a config the checks refuse)."""
    from omegaconf import open_dict

    from ragen_turn.compose import compose_config

    jobs = sweep_jobs(overrides)
    hydra_overrides = [o.input_line for o in _parse(overrides) if o.is_hydra_override()]
    check = None
    if validate:
        try:
            from ragen_turn.config import check_resolved as check
        except Exception as e:  # noqa: BLE001 - torch missing etc.: list without checking
            print(f"(configs not checked: {e})")
    dirs: Dict[str, int] = {}
    bad = 0
    for i, job in enumerate(jobs):
        cfg = compose_config(list(job) + hydra_overrides)  # finalized, its checks below (a refused job's run dir)
        d = str(cfg.trainer.default_local_dir)
        note = ""
        if d in dirs:
            note = f"  SAME RUN DIR AS JOB {dirs[d]}"
            bad += 1
        dirs.setdefault(d, i)
        if check is not None:
            with open_dict(cfg):
                cfg.device = "cpu"
            try:
                check(cfg)
            except ValueError as e:
                note += f"  INVALID: {e}"
                bad += 1
        print(f"{i:4d}  {d}  [{' '.join(job)}]{note}")
    print(f"{len(jobs)} jobs, {len(dirs)} distinct run dirs" + (f", {bad} problems" if bad else ""))
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragen_turn.sweeps", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for a --multirun "
                                                 "(e.g. env=sokoban algo=turn_ppo +sweep=gamma_lambda)")
    ap.add_argument("--no-check", action="store_true", help="skip the config checks")
    args = ap.parse_intermixed_args(argv)
    return list_jobs(args.overrides, validate=not args.no_check)


if __name__ == "__main__":
    sys.exit(main())
