"""The import rules of docs/ARCHITECTURE.md, checked on the source (``ast``), so a violation fails here first.

- the engines never import each other (``engines/local`` <-> ``engines/verl``);
- ``ragen_turn/algos`` is pure torch: it imports no engine, env, rollout, model or config module;
- the local trainer is imported only by the entry points (``train.py``, ``evaluate.py``) and the local
  benchmark; no module imports those entry points;
- no import cycle among ``ragen_turn`` modules, counting imports inside functions too (a lazy import
  still ties two modules together).

Every ``import`` statement counts, wherever it sits (a function-level import is a dependency too). The table of
part-to-part imports in docs/ARCHITECTURE.md is checked against the same graph.
"""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package name -> directory (envs/ installs as ragen_turn.envs, see setup.py)
SOURCES = {"ragen_turn": ROOT / "ragen_turn", "ragen_turn.envs": ROOT / "envs"}
LOCAL_TRAINER = "ragen_turn.engines.local.trainer"


def module_files() -> Dict[str, Path]:
    """``dotted module name -> file`` for every module of the package (``pkg/__init__.py`` is ``pkg``)."""
    out: Dict[str, Path] = {}
    for pkg, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def imports_of(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The ``ragen_turn`` modules that module ``name`` (file ``path``) imports, anywhere in its body.

    ``from pkg import x`` counts as importing ``pkg.x`` when that is a module, else ``pkg``.
    """
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            # the longest known module that t is or lies in (``import a.b.c`` imports a.b.c)
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> Dict[str, Set[str]]:
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    comps: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def edges(graph: Dict[str, Set[str]], src_prefix: str, dst_prefix: str) -> List[str]:
    def within(m: str, prefix: str) -> bool:
        return m == prefix or m.startswith(prefix + ".")

    return sorted(f"{a} -> {b}" for a, deps in graph.items() if within(a, src_prefix)
                  for b in deps if within(b, dst_prefix))


@pytest.fixture(scope="module")
def graph() -> Dict[str, Set[str]]:
    g = import_graph()
    assert "ragen_turn.engines.local.trainer" in g and "ragen_turn.envs.sokoban" in g  # the walk found the tree
    return g


def test_engines_never_import_each_other(graph):
    bad = edges(graph, "ragen_turn.engines.local", "ragen_turn.engines.verl")
    bad += edges(graph, "ragen_turn.engines.verl", "ragen_turn.engines.local")
    assert not bad, "an engine imports the other: " + ", ".join(bad)


@pytest.mark.parametrize("forbidden", ["ragen_turn.engines", "ragen_turn.envs", "ragen_turn.rollout",
                                       "ragen_turn.models", "ragen_turn.config", "ragen_turn.train",
                                       "ragen_turn.evaluate", "ragen_turn.warmstart", "ragen_turn.report"])
def test_algos_import_no_engine_env_or_rollout(graph, forbidden):
    bad = edges(graph, "ragen_turn.algos", forbidden)
    assert not bad, "ragen_turn.algos must stay pure torch: " + ", ".join(bad)


def test_only_entry_points_import_the_local_trainer(graph):
    users = sorted(a for a, deps in graph.items() if LOCAL_TRAINER in deps)
    assert set(users) <= {"ragen_turn.train", "ragen_turn.evaluate"}, users


def test_no_module_imports_an_entry_point(graph):
    """``train`` and ``evaluate`` are Hydra apps: what others need of them lives in ``compose`` (the config
    pipeline) and ``runtime``; ``engines/verl/check.py`` and ``report`` (through ``sweeps``) used to import train."""
    users = sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                   if b in ("ragen_turn.train", "ragen_turn.evaluate"))
    assert not users, users


def test_no_import_cycle(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import cycles among ragen_turn modules: " + "; ".join(" <-> ".join(c) for c in cycles)


def part_of(module: str) -> str:
    """The part of docs/ARCHITECTURE.md a module belongs to: ``envs``, ``engines`` (the shared files of
    ``engines/``), ``engines.local``, ``engines.verl``, or the first name under ``ragen_turn``."""
    p = module.split(".")
    if len(p) < 2:
        return module
    if p[1] == "engines" and len(p) > 2 and p[2] in ("local", "verl"):
        return f"engines.{p[2]}"
    return p[1]


def documented_arrows() -> Dict[str, Set[str]]:
    """The table of docs/ARCHITECTURE.md's "The arrows" section: ``part -> the parts it imports``."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## The arrows", 1)[1].split("\n## ", 1)[0]
    out: Dict[str, Set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        deps = set(re.findall(r"`([a-z_.]+)`", cells[1].split("(")[0])) if "nothing" not in cells[1] else set()
        for name in re.findall(r"`([a-z_.]+)`", cells[0]):
            out[name] = deps
    return out


def test_architecture_doc_states_the_import_graph(graph):
    actual: Dict[str, Set[str]] = {}
    for a, deps in graph.items():
        actual.setdefault(part_of(a), set()).update(part_of(b) for b in deps if part_of(b) != part_of(a))
    actual = {k: v for k, v in actual.items() if k != "ragen_turn"}
    doc = documented_arrows()
    assert doc == actual, {k: (sorted(doc.get(k, ())), sorted(actual.get(k, ())))
                           for k in set(doc) | set(actual) if doc.get(k) != actual.get(k)}


def test_checker_sees_violations(tmp_path):
    """The checks above can fail: a hand-made graph with each violation is caught."""
    g = {"ragen_turn.a": {"ragen_turn.b"}, "ragen_turn.b": {"ragen_turn.c"}, "ragen_turn.c": {"ragen_turn.a"},
         "ragen_turn.d": {"ragen_turn.a"}}
    assert find_cycles(g) == [["ragen_turn.a", "ragen_turn.b", "ragen_turn.c"]]
    g2 = {"ragen_turn.engines.verl.trainer": {"ragen_turn.engines.local.trainer"}}
    assert edges(g2, "ragen_turn.engines.verl", "ragen_turn.engines.local")
    known = {"ragen_turn", "ragen_turn.algos", "ragen_turn.algos.turns", "ragen_turn.engines.advantages"}
    src = ("from ..engines.advantages import x\nfrom . import turns\n\ndef f():\n"
           "    import ragen_turn.engines.advantages\n")
    probe = tmp_path / "probe.py"
    probe.write_text(src)
    parsed = imports_of("ragen_turn.algos.probe", probe, known)  # as if it were ragen_turn/algos/probe.py
    assert parsed == {"ragen_turn.engines.advantages", "ragen_turn.algos.turns"}


def _doc_blocks(lang: str) -> List[str]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    part = text[text.index("## A new algorithm = one registry entry + one YAML"):]
    return re.findall(rf"```{lang}\n(.*?)```", part, flags=re.S)


def test_a_new_algorithm_is_one_registry_entry_and_one_yaml(tmp_path):
    """ARCHITECTURE.md's worked example, run: its registry entry (exec'd in ``algos/advantages.py``'s
    namespace) and its YAML (as ``algo/rloo.yaml`` on Hydra's search path) train-check with no other edit:
    the critic level, the group-size and bootstrap checks all follow from the entry."""
    import torch

    from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY, adv_estimator_spec, advantages
    from ragen_turn.config import validate_config
    from helpers import micro_config

    (code,), (yaml_text,) = _doc_blocks("python"), _doc_blocks("yaml")
    (tmp_path / "algo").mkdir()
    (tmp_path / "algo" / "rloo.yaml").write_text(yaml_text)
    assert "rloo" not in ADV_ESTIMATOR_REGISTRY
    exec(code, dict(vars(advantages)))
    try:
        assert adv_estimator_spec("rloo").critic_level == "none"
        fn = ADV_ESTIMATOR_REGISTRY["rloo"]
        rewards = torch.tensor([[1.0], [0.0], [2.0], [3.0], [5.0]])  # by hand: minus the others' mean
        adv, ret = fn(turn_rewards=rewards, turn_mask=torch.ones(5, 1),
                      turn_ids=torch.zeros(5, 2, dtype=torch.long), response_mask=torch.ones(5, 2),
                      group_ids=torch.tensor([0, 0, 0, 1, 1]), values=None, config={})
        assert torch.allclose(adv[:, 0], torch.tensor([0.0, -1.5, 1.5, -2.0, 2.0])) and torch.equal(adv, ret)
        search = f"hydra.searchpath=[file://{tmp_path}]"
        cfg = micro_config([search, "algo=rloo"])
        assert cfg.algorithm.adv_estimator == "rloo" and cfg.critic.level == "none"
        validate_config(cfg)
        one_per_group = ["es_manager.train.group_size=1", "ppo_mini_batch_size=1"]
        for bad, key in ((one_per_group, "es_manager.train.group_size=1: rloo needs >= 2"),
                         (["algorithm.bootstrap_truncated=true"], "algorithm.bootstrap_truncated")):
            with pytest.raises(ValueError, match=key):
                validate_config(micro_config([search, "algo=rloo", *bad]))
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("rloo", None)


def test_a_working_tree_that_is_not_installed_finds_its_envs(tmp_path):
    """The GPU scripts run ``python -m ragen_turn.train`` from a copy of the tree with no install: ragen_turn.envs is
    that copy's top-level envs/ (ragen_turn/__init__.py), as setup.py's package_dir maps it on an install, and the
    copy's benchmarks/, scripts/ and tests/ are not ragen_turn subpackages (issue #62 item 7). Run with
    ``-S`` and the dependencies on PYTHONPATH, so this venv's editable install (its finder) is not there to help."""
    import shutil
    import site
    import subprocess
    import sys

    tree = tmp_path / "tree"
    for part in ("ragen_turn", "envs"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(ROOT / "setup.py", tree / "setup.py")
    for other in ("benchmarks", "scripts", "tests"):  # the tree's other top-level folders stay out of the package
        (tree / other).mkdir()
        (tree / other / "probe.py").write_text("")
    code = ("import ragen_turn.envs.sokoban.env as m, ragen_turn.envs as e; print(m.__file__); "
            "print(sorted(e.REGISTERED_ENVS)[:3]); import importlib.util as u; print(u.find_spec('ragen_turn.envs')); "
            "import ragen_turn; print([u.find_spec(f'ragen_turn.{x}') for x in ('benchmarks', 'scripts', 'tests')]); "
            "print(ragen_turn.__path__)")
    env = {"PYTHONPATH": os.pathsep.join([str(tree), *site.getsitepackages()]), "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(tree / "envs" / "sokoban" / "env.py"), out.stdout
    assert lines[3] == "[None, None, None]" and lines[4] == str([str(tree / "ragen_turn")]), out.stdout
    assert not (tree / "ragen_turn" / "envs").exists()  # nothing made inside the package


# ---------------------------------------------------------------------------------------- the names the doc cites
# cited on purpose though not in this tree: the worked example's new files and names, verl's own classes and
# methods, and a generic call or key
NOT_OURS = {"config/algo/rloo.yaml", "rloo", "DataProto", "DataProto.select_idxs", "RayPPOTrainer",
            "_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values",  # RayPPOTrainer's own steps
            "optimizer.step()", "cfg.a.b"}


def defined_names() -> Dict[str, Set[str]]:
    """``scope -> the names defined in it``, over ``ragen_turn/`` and ``envs/``: a scope is a module's path without
    ``.py`` (``ragen_turn/engines/advantages``; a package's ``__init__`` is the package), each tail of it
    (``engines/advantages``, ``advantages``) and each class name; ``""`` holds every name. A name is defined by a
    def, a class, an assignment, an import or a keyword argument's name in a registry call."""
    out: Dict[str, Set[str]] = {"": set()}
    for path in [*(ROOT / "ragen_turn").rglob("*.py"), *(ROOT / "envs").rglob("*.py")]:
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        names: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    inner = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                    inner |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                              if isinstance(t, ast.Name)}
                    out.setdefault(node.name, set()).update(inner)
                    out[""] |= inner
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and getattr(node.func, "id", "").startswith("register"):
                names.add(node.args[0].value)  # a registry entry's name: @register_policy_loss("turn_ppo", ...)
        for i in range(len(parts)):
            out.setdefault("/".join(parts[i:]), set()).update(names)
        out[""] |= names
    return out


def config_keys() -> Set[str]:
    """Every dotted key of the schema and each of its tails (``critic.level``, ``level``), and RAGEN's keys."""
    from ragen_turn import schema

    keys: Set[str] = set()

    def walk(cls, prefix):
        for f in dataclasses_fields(cls):
            key = prefix + f.name
            sub = schema._inner(f.type)
            if isinstance(sub, type) and hasattr(sub, "__dataclass_fields__"):
                walk(sub, key + ".")
            parts = key.split(".")
            keys.update(".".join(parts[i:]) for i in range(len(parts)))

    walk(schema.RunConfig, "")
    from ragen_turn.ragen_keys import BY_KEY  # RAGEN's keys, mapped onto ours (system.CUDA_VISIBLE_DEVICES)

    return keys | set(BY_KEY)


def dataclasses_fields(cls):
    import dataclasses

    return dataclasses.fields(cls)


def cited_names() -> List[str]:
    """The code names ARCHITECTURE.md cites in backticks: paths (``algos/losses.py``, ``engines/``), dotted names
    (``rollout_filter.filter_rows``, ``StarPOTrainer.train_step``, ``critic.level``) and names with an underscore or
    a capital (``critic_targets``, ``GlobalCounts``). Plain words (``turn``, ``none``) and code with spaces or
    operators (a command line, ``key=value``) are left out."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for tok in re.findall(r"`([^`\n]+)`", text):
        if re.fullmatch(r"[\w./]+(\(\))?", tok) and ("/" in tok or "." in tok or "_" in tok or tok != tok.lower()):
            out.append(tok)
    return sorted(set(out))


def _is_module(dotted: str) -> bool:
    """``engines.verl``, ``ragen_turn.envs``: a package or module of ours (``ragen_turn.`` optional)."""
    parts = dotted.split(".")
    parts = parts[1:] if parts[0] == "ragen_turn" else parts
    if parts and parts[0] == "envs":
        base, parts = ROOT / "envs", parts[1:]
    else:
        base = ROOT / "ragen_turn"
    path = base.joinpath(*parts)
    return path.is_dir() or path.with_suffix(".py").is_file()


def _cited_exists(tok: str, names: Dict[str, Set[str]], keys: Set[str]) -> bool:
    from ragen_turn import runfiles

    tok = tok.removesuffix("()")
    if tok in vars(runfiles).values() or _is_module(tok) or tok in keys:  # a run's file, a module, a config key
        return True
    if "/" in tok or re.search(r"\.(py|yaml|md)$", tok):  # a path: from the root, ragen_turn/ or as a tail
        if any((base / tok).exists() for base in (ROOT, ROOT / "ragen_turn", ROOT / "ragen_turn" / "engines")):
            return True
        if any(p.relative_to(ROOT).as_posix().endswith("/" + tok.rstrip("/"))
               for d in ("ragen_turn", "envs", "config") for p in ROOT.glob(f"{d}/**/*")):
            return True
    scope, _, name = tok.rpartition(".")  # engines/advantages.compute_advantages, Trajectory.from_episodes
    if scope and name in names.get(scope.replace(".", "/"), ()):
        return True
    return not scope and tok in names[""]


def test_the_names_architecture_md_cites_exist():
    """Each file, module, function, class, method and config key docs/ARCHITECTURE.md names in backticks is in the
    tree (issue #62: it named ``common.compute_advantages`` and ``common.pad_rows`` long after they moved)."""
    names, keys = defined_names(), config_keys()
    cited = cited_names()
    assert {"rollout_filter.filter_rows", "StarPOTrainer.train_step", "critic_targets", "algos/losses.py"} <= set(cited)
    missing = [t for t in cited if t not in NOT_OURS and not _cited_exists(t, names, keys)]
    assert not missing, f"docs/ARCHITECTURE.md cites names this tree lacks: {missing}"
    for stale in ("common.compute_advantages", "common.pad_rows", "engines/nowhere.py", "StarPOTrainer.no_such"):
        assert not _cited_exists(stale, names, keys), stale  # the check can fail


# ---------------------------------------------------------------------------------------- repeated blocks
def repeated_blocks(files: List[Path], root: Path = ROOT, width: int = 6, min_chars: int = 100) -> List[List[str]]:
    """Blocks of ``width`` code lines (stripped; blank lines, comments and lone closers / ``else:`` / ``try:`` left
    out) of at least ``min_chars`` characters that appear at more than one place, as ``["file:line", ...]``."""
    trivial = {")", "]", "}", "else:", "try:", '"""', "return out", "return None"}
    seen: Dict[tuple, List[str]] = {}
    for path in files:
        lines = [(i + 1, t.strip()) for i, t in enumerate(path.read_text().splitlines())]
        lines = [(i, t) for i, t in lines if t and not t.startswith("#") and t not in trivial]
        for k in range(len(lines) - width + 1):
            block = tuple(t for _, t in lines[k:k + width])
            if sum(map(len, block)) >= min_chars:
                seen.setdefault(block, []).append(f"{path.relative_to(root)}:{lines[k][0]}")
    return [where for where in seen.values() if len(where) > 1]


def test_no_block_of_six_lines_is_repeated(tmp_path):
    """Issue #62: a block of six or more code lines lives once in ragen_turn/ and envs/ (the decode step, the envs'
    success / done members were copies); the checker finds a planted copy."""
    files = sorted([*(ROOT / "ragen_turn").rglob("*.py"), *(ROOT / "envs").rglob("*.py")])
    assert not repeated_blocks(files)
    block = "".join(f"value_{i} = compute_something_long(argument_{i}, other_argument_{i})\n" for i in range(6))
    planted = [tmp_path / "a.py", tmp_path / "b.py"]
    for p in planted:
        p.write_text(f"import {p.stem}\n" + block)
    assert repeated_blocks(planted, tmp_path) == [["a.py:2", "b.py:2"]]
