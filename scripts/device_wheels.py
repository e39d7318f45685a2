"""The wheel shuttle: Python packages to a GPU machine with no network, in carries of a few tens of MiB.

The device tool carries at most 64 MiB per call, the working tree included, and keeps ignored files (and
``/tmp``) while the machine stays warm. So wheels go over in batches, one batch per call, and a wheel
larger than a batch (ray's is ~79 MB) goes in parts. Steps (``bash scripts/device_wheels.sh STEP ...``):

here (network: PyPI)
  ``download [DIR] [--req FILE]``   wheels for the GPU machine's Python (3.12, manylinux x86-64) into
                                    ``DIR/wheels`` (``pip download --no-deps --only-binary=:all:``), pinned
                                    by ``scripts/device_wheels.txt`` (``--req`` repeatable: add
                                    ``scripts/device_wheels_smol.txt`` for SmolLM2)
  ``pack [DIR] [--limit MIB]``      ``DIR/batch-NN/``: each at most the batch budget (the carry limit less
                                    the working tree that travels with it), files over it split into parts;
                                    every batch holds ``MANIFEST`` (sha256, size, name of every whole wheel)
there (no network; each call carries one batch)
  ``receive BATCH STAGE``           copy the batch's pieces into ``STAGE`` (outside the repository)
  ``missing STAGE``                 the wheels not yet complete in ``STAGE`` (exit 1 if any)
  ``install STAGE TARGET``          join the parts, check every wheel's sha256 against ``MANIFEST``, then
                                    ``pip install --no-index --no-deps --find-links ... --target TARGET``

Only the standard library: this runs on both machines. See docs/verl.md ("On a GPU machine without network").
"""
from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

MIB = 1 << 20
CARRY_LIMIT_MIB = 64          # the device tool's limit per call: the working tree plus what `carry` names
MARGIN_MIB = 2                # room for untracked files and the tree's growth between pack and run
REPO = Path(__file__).resolve().parent.parent
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")
PART = re.compile(r"^(?P<name>.+)\.part(?P<i>\d+)-of-(?P<n>\d+)$")


# ------------------------------------------------------------------------------------------------
# shared
# ------------------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path: Path) -> Dict[str, Tuple[str, int]]:
    """``MANIFEST`` lines ``<sha256> <size> <name>`` -> {name: (sha256, size)}."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, size, name = line.split(maxsplit=2)
            out[name] = (digest, int(size))
    return out


def write_manifest(wheels: List[Path], path: Path) -> None:
    path.write_text("".join(f"{sha256(w)} {w.stat().st_size} {w.name}\n" for w in sorted(wheels)))


# ------------------------------------------------------------------------------------------------
# here
# ------------------------------------------------------------------------------------------------
def read_requirements(req: Path) -> Tuple[List[str], List[str]]:
    """Pinned lines of ``req``: (wheels to download, sdists to build here: lines marked ``# sdist``)."""
    wheels, sdists = [], []
    for line in req.read_text().splitlines():
        spec, _, comment = line.partition("#")
        if spec.strip():
            (sdists if comment.strip().startswith("sdist") else wheels).append(spec.strip())
    return wheels, sdists


def download(out: Path, reqs: List[Path], python_version: str = "3.12") -> List[Path]:
    """``pip download`` every pinned wheel of the ``reqs`` files for the GPU machine (no dependencies: the
    lists are complete), ``pip wheel`` the ``# sdist`` lines (which must give pure-Python wheels)."""
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    binary, sdists = [], []
    for req in reqs:
        b, s_ = read_requirements(req)
        binary += b
        sdists += s_
    abi = "cp" + python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + ["-d", str(wheels), *binary], check=True)
    for spec in sdists:
        before = set(wheels.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary", ":all:",
                        "-w", str(wheels), spec], check=True)
        for w in set(wheels.glob("*.whl")) - before:
            if not w.name.endswith("-none-any.whl"):
                w.unlink()
                raise ValueError(f"{spec} built {w.name}, which is not pure Python: it would not run on "
                                 "the GPU machine; find a wheel for it instead")
    return sorted(wheels.glob("*.whl"))


def travelling_tree_bytes(repo: Path = REPO) -> int:
    """Bytes of the files the device tool sends with every call: tracked and untracked-not-ignored files."""
    try:
        ls = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    total = 0
    for name in ls.decode().split("\0"):
        f = repo / name
        if name and f.is_file() and not f.is_symlink():
            total += f.stat().st_size
    return total


def batch_budget(limit_mib: float, tree_bytes: int) -> int:
    """Bytes one batch may hold: the carry limit less the travelling tree and a margin.

    ValueError when that leaves less than 1 MiB."""
    budget = int(limit_mib * MIB) - tree_bytes - MARGIN_MIB * MIB
    if budget < MIB:
        raise ValueError(f"--limit {limit_mib} MiB leaves {budget / MIB:.1f} MiB per batch after the working "
                         f"tree ({tree_bytes / MIB:.1f} MiB) and a {MARGIN_MIB} MiB margin: raise --limit or "
                         "--tree-mib")
    return budget


def split_file(src: Path, dest: Path, piece: int) -> List[Path]:
    """``src`` -> ``dest/<name>.partI-of-N`` of at most ``piece`` bytes each (one file when it fits)."""
    size = src.stat().st_size
    n = max(1, -(-size // piece))
    if n == 1:
        shutil.copyfile(src, dest / src.name)
        return [dest / src.name]
    parts = []
    with open(src, "rb") as f:
        for i in range(n):
            p = dest / f"{src.name}.part{i:02d}-of-{n:02d}"
            p.write_bytes(f.read(piece))
            parts.append(p)
    return parts


def pack(out: Path, limit_mib: float = CARRY_LIMIT_MIB, tree_bytes: int = None) -> List[Path]:
    """``out/wheels/*.whl`` -> ``out/MANIFEST`` and ``out/batch-NN/`` of at most :func:`batch_budget` bytes
    each (each with a copy of MANIFEST).

    Files over the budget are split into parts; pieces are packed largest first into the first batch
    with room. Returns the batch directories, in order.
    """
    tree = travelling_tree_bytes() if tree_bytes is None else tree_bytes
    wheels = sorted((out / "wheels").glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {out / 'wheels'}: run `device_wheels.sh download {out}` first")
    manifest = out / "MANIFEST"
    write_manifest(wheels, manifest)
    budget = batch_budget(limit_mib, tree) - manifest.stat().st_size
    pieces_dir = out / "pieces"
    shutil.rmtree(pieces_dir, ignore_errors=True)
    pieces_dir.mkdir()
    pieces: List[Path] = []
    for name in read_manifest(manifest):
        pieces += split_file(out / "wheels" / name, pieces_dir, budget)
    batches: List[List[Path]] = []
    room: List[int] = []
    for p in sorted(pieces, key=lambda p: (-p.stat().st_size, p.name)):
        size = p.stat().st_size
        i = next((i for i, r in enumerate(room) if r >= size), None)
        if i is None:
            batches.append([])
            room.append(budget)
            i = len(batches) - 1
        batches[i].append(p)
        room[i] -= size
    for old in out.glob("batch-*"):
        shutil.rmtree(old)
    dirs = []
    for i, files in enumerate(batches, 1):
        d = out / f"batch-{i:02d}"
        d.mkdir()
        for f in files:
            f.rename(d / f.name)
        shutil.copyfile(manifest, d / "MANIFEST")
        dirs.append(d)
    pieces_dir.rmdir()
    total = sum(s for _, s in read_manifest(manifest).values())
    print(f"[device_wheels] {len(read_manifest(manifest))} wheels, {total / MIB:.1f} MiB -> {len(dirs)} "
          f"batches of at most {budget / MIB:.1f} MiB (carry limit {limit_mib} MiB, working tree "
          f"{tree / MIB:.1f} MiB)")
    return dirs


# ------------------------------------------------------------------------------------------------
# there
# ------------------------------------------------------------------------------------------------
def receive(batch: Path, stage: Path) -> List[str]:
    """Copy a batch's pieces and its MANIFEST into ``stage``; returns the names copied."""
    if not (batch / "MANIFEST").is_file():
        raise FileNotFoundError(f"{batch}/MANIFEST is missing: was {batch} named in the run's carry?")
    stage.mkdir(parents=True, exist_ok=True)
    old = stage / "MANIFEST"
    if old.is_file() and old.read_bytes() != (batch / "MANIFEST").read_bytes():
        raise ValueError(f"{batch}/MANIFEST differs from {stage}/MANIFEST: these batches come from two "
                         f"packs; empty {stage} and carry the batches of one pack")
    names = []
    for f in sorted(batch.iterdir()):
        shutil.copyfile(f, stage / f.name)
        names.append(f.name)
    return names


def _pieces(stage: Path, name: str) -> Tuple[List[Path], int]:
    """The parts of ``name`` in ``stage`` (sorted) and how many there should be (0: no parts found)."""
    found, n = [], 0
    for f in stage.glob(f"{glob_escape(name)}.part*"):
        m = PART.match(f.name)
        if m and m["name"] == name:
            found.append(f)
            n = int(m["n"])
    return sorted(found), n


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


def missing(stage: Path) -> List[str]:
    """Manifest wheels not complete in ``stage``: ``name`` or ``name (parts k of n here)``."""
    manifest = stage / "MANIFEST"
    if not manifest.is_file():
        return ["MANIFEST (no batch received yet)"]
    out = []
    for name in read_manifest(manifest):
        if (stage / name).is_file():
            continue
        parts, n = _pieces(stage, name)
        if not parts or len(parts) != n:
            out.append(f"{name} ({len(parts)} of {n or '?'} parts here)")
    return out


def join(stage: Path, dest: Path) -> List[Path]:
    """Every manifest wheel whole in ``dest`` (parts joined in order), checked against its sha256 and size.

    Raises ValueError naming what is missing or which wheel's digest differs.
    """
    gone = missing(stage)
    if gone:
        raise ValueError(f"not all batches have been received into {stage}; missing: {', '.join(gone)}")
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, (digest, size) in read_manifest(stage / "MANIFEST").items():
        whole = dest / name
        if (stage / name).is_file():
            shutil.copyfile(stage / name, whole)
        else:
            with open(whole, "wb") as w:
                for p in _pieces(stage, name)[0]:
                    with open(p, "rb") as r:
                        shutil.copyfileobj(r, w)
        got = sha256(whole)
        if got != digest or whole.stat().st_size != size:
            raise ValueError(f"{name}: sha256 {got} ({whole.stat().st_size} bytes) differs from the "
                             f"MANIFEST's {digest} ({size} bytes): a part was damaged or comes from another "
                             "pack")
        out.append(whole)
    return out


def install(stage: Path, target: Path, python: str = None) -> List[Path]:
    """Join and check (:func:`join`), then install every wheel into ``target`` (no network, no deps)."""
    wheels = join(stage, stage / "joined")
    cmd = [python or sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--find-links", str(stage / "joined"), "--target", str(target)]
    subprocess.run(cmd + [str(w) for w in wheels], check=True)
    print(f"[device_wheels] {len(wheels)} wheels installed into {target}: "
          f"export PYTHONPATH={target}:$PYTHONPATH")
    return wheels


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="device_wheels.sh", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    d = sub.add_parser("download", help="here: pip download the pinned wheels for the GPU machine")
    d.add_argument("dir", nargs="?", default=str(REPO / ".wheels"))
    d.add_argument("--req", action="append", default=None,
                   help="a pinned list (repeatable; default scripts/device_wheels.txt; "
                        "scripts/device_wheels_smol.txt adds SmolLM2)")
    d.add_argument("--python-version", default="3.12")
    p = sub.add_parser("pack", help="here: batches of at most the carry limit, big files in parts")
    p.add_argument("dir", nargs="?", default=str(REPO / ".wheels"))
    p.add_argument("--limit", type=float, default=CARRY_LIMIT_MIB,
                   help="carry limit per call, MiB (default 64)")
    p.add_argument("--tree-mib", type=float, default=None,
                   help="MiB of working tree that travels with each call (default: measured with git here)")
    r = sub.add_parser("receive", help="there: copy one carried batch into the stage folder")
    r.add_argument("batch")
    r.add_argument("stage")
    m = sub.add_parser("missing", help="there: the wheels not yet complete in the stage (exit 1 if any)")
    m.add_argument("stage")
    i = sub.add_parser("install", help="there: join, check sha256, pip install --target")
    i.add_argument("stage")
    i.add_argument("target")
    i.add_argument("--python", default=None, help="the interpreter whose pip installs (default: this one)")
    a = ap.parse_args(argv)
    try:
        if a.step == "download":
            reqs = [Path(r) for r in (a.req or [REPO / "scripts" / "device_wheels.txt"])]
            names = download(Path(a.dir), reqs, a.python_version)
            print(f"[device_wheels] {len(names)} wheels in {a.dir}/wheels")
        elif a.step == "pack":
            tree = None if a.tree_mib is None else int(a.tree_mib * MIB)
            for d_ in pack(Path(a.dir), a.limit, tree):
                size = sum(f.stat().st_size for f in d_.iterdir())
                print(f"  {d_}  {size / MIB:.1f} MiB, {len(list(d_.iterdir())) - 1} pieces")
        elif a.step == "receive":
            names = receive(Path(a.batch), Path(a.stage))
            gone = missing(Path(a.stage))
            print(f"[device_wheels] {len(names) - 1} pieces into {a.stage}; "
                  + (f"{len(gone)} wheels still incomplete" if gone else "all wheels complete"))
        elif a.step == "missing":
            gone = missing(Path(a.stage))
            print("\n".join(gone) if gone else "[device_wheels] all wheels complete")
            return 1 if gone else 0
        elif a.step == "install":
            install(Path(a.stage), Path(a.target), a.python)
    except (ValueError, FileNotFoundError) as e:
        print(f"device_wheels.sh {a.step}: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"device_wheels.sh {a.step}: {' '.join(e.cmd[:5])} ... failed (exit {e.returncode}); see above",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
