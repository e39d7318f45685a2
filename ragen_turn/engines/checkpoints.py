"""A run's ``checkpoints/`` directory: which step directories are complete, what a resume loads, what rotation
deletes, and how a crash at any moment leaves it loadable. Both engines: the local engine's ``checkpoints/step_N``
with ``latest``; the verl engine's ``<run>/global_step_N`` with verl's tracker file
``latest_checkpointed_iteration.txt`` (holds the step number; :data:`VERL_TRACKER`).

Layout::

    checkpoints/step_000010/    a complete checkpoint: renamed into place from .tmp_step_000010/ after its
        complete.json           files were written and synced; lists every file, its size and its sha256
    checkpoints/latest          the newest complete step directory's name (written atomically)
    checkpoints/last_good       the newest checkpoint confirmed by a healthy step after it (see below)
    checkpoints/.tmp_step_*     being written (removed at the next start if the writer died)
    checkpoints/.del_step_*     being deleted (renamed first, so no half-deleted step_* is ever left)

A resume loads the newest complete step directory whose files match their checksums (every entry of
``complete.json`` inside the directory, every file listed); one that cannot be verified (no ``complete.json``:
written before checksums, or the file removed) is refused (:class:`UnverifiedCheckpoint`) unless
``trainer.load_unverified=true``, never loaded silently. ``latest`` is read
first and a disagreement (missing, empty, garbage, naming an incomplete, corrupt or older directory) is said in
one line. A checkpoint is *confirmed* when the
step after it updates with finite losses and gradients (its weights were sound); rotation never deletes the
newest confirmed one, so a blow-up that fills ``keep_checkpoints`` with broken checkpoints leaves a good one.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ragen_turn.runfiles import TRAINER_STATE_FILE

from .rundir import atomic_write_text, crash_point, fsync_dir, fsync_tree, writing

MANIFEST = "complete.json"
ADAPTER_DIR = "actor_adapter"  # a LoRA run's adapter (peft's files), beside actor/ (the merged model)
LATEST = "latest"
LAST_GOOD = "last_good"
VERL_TRACKER = "latest_checkpointed_iteration.txt"  # verl's pointer: the newest step's number
POINTERS = (LATEST, LAST_GOOD, VERL_TRACKER)
_STEP_DIR = re.compile(r"^(?:global_)?step_(\d+)$")  # ours (step_000010) and verl's (global_step_10)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def verl_dir_name(step: int) -> str:
    return f"global_step_{step}"


def step_of(path: Path) -> Optional[int]:
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _legacy_complete(path: Path) -> bool:
    """A directory written before manifests existed: the local engine's (trainer_state.pt + actor/config.json)
    or verl's own (data.pt, written after the workers' files)."""
    return ((path / TRAINER_STATE_FILE).is_file() and (path / "actor" / "config.json").is_file()) or \
        ((path / "data.pt").is_file() and (path / "actor").is_dir())


class UnverifiedCheckpoint(ValueError):
    """The checkpoint a resume would load has no checksums to verify its files against (no ``complete.json``, or
    one without sha256): refused unless ``trainer.load_unverified=true`` (a ValueError: exit code 2)."""


LOAD_UNVERIFIED_KEY = "trainer.load_unverified"


def unverified_reason(path: Path) -> Optional[str]:
    """Why checkpoint ``path``'s files cannot be verified (no ``complete.json``, or one without a sha256 for every
    file it lists), or None when they can."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return f"it has no {MANIFEST} (written before checksums existed, or the file was removed)"
    try:
        doc = json.loads(manifest.read_text())
        missing = sorted(set(doc["files"]) - set(doc.get("sha256") or {}))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None  # unreadable: incomplete_reason says so
    if missing:
        return f"its {MANIFEST} has no sha256 for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
    return None


def _outside(path: Path, rel: str) -> bool:
    """``rel`` (an entry of ``path``'s manifest) names a file outside checkpoint ``path``: absolute, with ``..``,
    or through a link that leads out."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        return True
    root = Path(path).resolve()
    return root not in (root / rel).resolve().parents


def incomplete_reason(path: Path, verify: bool = False) -> Optional[str]:
    """Why step directory ``path`` cannot be loaded, or None when it is complete.

    Complete = its manifest lists files that are all there with their sizes. ``verify``: and every entry stays
    inside the checkpoint, every file is listed, and each matches its sha256; a checkpoint whose files cannot be
    verified (:func:`unverified_reason`) is not loadable then. Without ``verify``, a directory written before
    manifests existed counts as complete when it has ``trainer_state.pt`` and ``actor/config.json`` (verl:
    ``data.pt`` and ``actor/``): the start-of-run cleaning keeps it, a resume refuses it
    (:class:`UnverifiedCheckpoint`)."""
    path = Path(path)
    if not path.is_dir():
        return "missing"
    manifest = path / MANIFEST
    if not manifest.is_file():
        if _legacy_complete(path):
            return f"unverified: {unverified_reason(path)}" if verify else None
        return f"no {MANIFEST} and no trainer_state.pt + actor/config.json"
    try:
        doc = json.loads(manifest.read_text())
        files: Dict[str, int] = doc["files"]
        sums: Dict[str, str] = doc.get("sha256") or {}
        files.items(), sums.items()
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for rel, size in files.items():
        if _outside(path, rel):
            if verify:
                return f"{MANIFEST} lists {rel!r}, outside the checkpoint"
            continue
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, {size} expected"
    if verify:
        bad = [rel for rel in sums if _outside(path, rel)]
        if bad:
            return f"{MANIFEST} lists {bad[0]!r}, outside the checkpoint"
        why = unverified_reason(path)
        if why is not None:
            return f"unverified: {why}"
        unlisted = sorted(str(p.relative_to(path)) for p in path.rglob("*")
                          if (p.is_file() or p.is_symlink()) and p.name != MANIFEST
                          and str(p.relative_to(path)) not in files)
        if unlisted:
            return f"{unlisted[0]} is not listed in {MANIFEST} (added after the checkpoint was written)"
        for rel, want in sums.items():
            if file_sha256(path / rel) != want:
                return f"{rel} does not match its sha256 in {MANIFEST} (corrupt)"
    return None


def check_unverified(ckpt_dir: Path, path: Path, verified: Optional[Path], engine: str = "local") -> None:
    """Raise :class:`UnverifiedCheckpoint` for checkpoint ``path``: the line names it, why it cannot be verified,
    the newest verified checkpoint (``verified``) and the keys that load either one."""
    older = (f"the newest verified checkpoint is {verified.name} (trainer.resume_from={verified.name} resumes from "
             "it)") if verified is not None else f"no verified checkpoint is in {ckpt_dir}"
    risk = ("verl's checkpoint loader unpickles its files, which runs any code planted in them" if engine == "verl"
            else "its weights and optimizer state are loaded as they are, with no check that they are the ones "
                 "written")
    raise UnverifiedCheckpoint(
        f"trainer.resume=true: checkpoint {path} is unverified ({unverified_reason(path)}): its files cannot be "
        f"checked against the checksums written with them, so it is not loaded; {older}. To load it knowingly "
        f"({risk}): {LOAD_UNVERIFIED_KEY}=true")


def step_dirs(ckpt_dir: Path) -> List[Path]:
    """``step_*`` directories, oldest first (by step number)."""
    if not Path(ckpt_dir).is_dir():
        return []
    found = [p for p in Path(ckpt_dir).iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of)


def _read_pointer(ckpt_dir: Path, name: str) -> Optional[str]:
    return read_pointer(ckpt_dir, name)[0]


def read_pointer(ckpt_dir: Path, name: str) -> Tuple[Optional[str], str]:
    """The step directory's name a pointer file holds (None when it holds none) and what was found, in words.
    ``latest`` / ``last_good`` hold a name (``step_000010``); verl's tracker a step number (``10``)."""
    p = Path(ckpt_dir) / name
    try:
        raw = p.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None, "is missing"
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return None, "is empty"
    if name == VERL_TRACKER:
        if text.isdigit() and len(text) < 19:
            return verl_dir_name(int(text)), f"names step {text}"
    elif step_of(Path(text)) is not None and "/" not in text:
        return text, f"names {text!r}"
    shown = text if len(text) <= 40 and text.isprintable() else repr(raw[:24])[2:-1] + "..."
    return None, f"holds {len(raw)} bytes that name no checkpoint ({shown})"


def remove_dir(path: Path, log: Optional[Callable[[str], None]] = None, why: str = "") -> None:
    """Delete a directory so that a crash midway leaves no half-deleted ``step_*``: rename it to
    ``.del_<name>`` first (removed at the next start if this process dies here)."""
    path = Path(path)
    gone = path.with_name(f".del_{path.name}")
    if gone.exists():
        shutil.rmtree(gone, ignore_errors=True)
    os.replace(path, gone)
    crash_point(f"{path.name}: renamed for deletion")
    shutil.rmtree(gone, ignore_errors=True)
    crash_point(f"{path.name}: deleted")
    if log and why:
        log(f"[ragen_turn] removed {path} ({why})")


def clean(ckpt_dir: Path, log: Callable[[str], None] = print) -> None:
    """At the start of a run (the run-dir lock held): remove what a dead writer left: ``.tmp_*`` and ``.del_*``
    directories, temp pointer files, and ``step_*`` directories that are not complete."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return
    for p in sorted(ckpt_dir.iterdir()):
        if p.name.startswith((".tmp_step_", ".del_step_", ".tmp_global_step_", ".del_global_step_")):
            shutil.rmtree(p, ignore_errors=True)
            log(f"[ragen_turn] removed {p} (left by a run that stopped while writing or deleting it)")
        elif p.name.startswith(tuple(f".{name}.tmp-" for name in POINTERS)):
            p.unlink(missing_ok=True)
    for p in step_dirs(ckpt_dir):
        why = incomplete_reason(p)
        if why is not None:
            remove_dir(p, log, f"incomplete checkpoint: {why}")


def resume_point(ckpt_dir: Path, log: Callable[[str], None] = print, pointer: str = LATEST,
                 verify: bool = True, skip: Tuple[str, ...] = (), allow_unverified: bool = False,
                 engine: str = "local") -> Optional[Path]:
    """The checkpoint a resume loads: the newest complete step directory whose files match their sha256
    (``verify``), None when there is none; ``skip``: names already tried. ``pointer`` (``latest``, or verl's
    tracker file) is read first; when it is missing, empty, garbage, names an incomplete or corrupt directory or
    an older one than the newest complete, one line says so; so does each corrupt directory passed over. With
    ``verify``, a newest loadable checkpoint that cannot be verified (no ``complete.json``: :func:`unverified_reason`)
    raises :class:`UnverifiedCheckpoint` naming it and the newest verified one, unless ``allow_unverified``
    (``trainer.load_unverified=true``: loaded with a line saying so)."""
    ckpt_dir = Path(ckpt_dir)
    complete = [p for p in step_dirs(ckpt_dir) if incomplete_reason(p) is None and p.name not in skip]
    named, found = read_pointer(ckpt_dir, pointer)
    newest = None
    for i, p in enumerate(reversed(complete)):
        bad = incomplete_reason(p, verify=True) if verify else None
        if bad is None:
            newest = p
            break
        if bad.startswith("unverified") and not allow_unverified:
            older = next((q for q in reversed(complete[:len(complete) - 1 - i])
                          if incomplete_reason(q, verify=True) is None), None)
            check_unverified(ckpt_dir, p, older, engine)
        if bad.startswith("unverified"):
            log(f"[ragen_turn] checkpoint {p} is {bad}; loading it anyway ({LOAD_UNVERIFIED_KEY}=true)")
            newest = p
            break
        log(f"[ragen_turn] checkpoint {p} is not loadable: {bad}; trying an older one")
    if newest is None:
        if named is not None or complete:
            log(f"[ragen_turn] {ckpt_dir / pointer} {found} but no complete, sound checkpoint is in {ckpt_dir}")
        return None
    if named != newest.name:
        if named is None:
            why = found
        elif named in skip:
            why = f"{found}, which did not load"
        elif incomplete_reason(ckpt_dir / named, verify=verify) is not None:
            bad = incomplete_reason(ckpt_dir / named, verify=verify)
            why = f"{found}, which is not a complete checkpoint ({bad})"
        else:
            why = f"{found}, older than the newest complete checkpoint"
        log(f"[ragen_turn] {ckpt_dir / pointer} {why}: resuming from {newest.name} "
            "(the newest complete checkpoint)")
    return newest


def last_good(ckpt_dir: Path) -> Optional[Path]:
    """The newest confirmed checkpoint (see the module doc), if it is still complete."""
    named = _read_pointer(ckpt_dir, LAST_GOOD)
    if named is None or incomplete_reason(Path(ckpt_dir) / named) is not None:
        return None
    return Path(ckpt_dir) / named


def check_resume_target(ckpt_dir: Path, resume_from: Optional[str] = None, allow_unverified: bool = False,
                        engine: str = "local") -> None:
    """The train command's check before any work (no checksums computed: that is the resume's): the checkpoint
    a resume would load (``resume_from``, else the newest complete) is there and, unless ``allow_unverified``,
    has checksums to verify it against (:class:`UnverifiedCheckpoint`, naming the newest one that has)."""
    ckpt_dir = Path(ckpt_dir)
    if resume_from and resume_from != LATEST:
        p = find(ckpt_dir, resume_from)
    else:
        complete = [q for q in step_dirs(ckpt_dir) if incomplete_reason(q) is None]
        p = complete[-1] if complete else None
    if p is None or allow_unverified or unverified_reason(p) is None:
        return
    older = [q for q in step_dirs(ckpt_dir) if step_of(q) < step_of(p) and incomplete_reason(q) is None
             and unverified_reason(q) is None]
    check_unverified(ckpt_dir, p, older[-1] if older else None, engine)


def newest_complete(ckpt_dir: Path) -> Optional[Path]:
    complete = [p for p in step_dirs(ckpt_dir) if incomplete_reason(p) is None]
    return complete[-1] if complete else None


def begin(ckpt_dir: Path, step: int, name: Optional[str] = None) -> Path:
    """A fresh staging directory ``.tmp_<name>`` (``.tmp_step_N``) to write checkpoint ``step`` into."""
    tmp = Path(ckpt_dir) / f".tmp_{name or step_dir_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    crash_point(f"{tmp.name}: created")
    return tmp


def write_manifest(tmp: Path, step: int) -> None:
    """``complete.json`` in staging directory ``tmp``: every file's size and sha256."""
    found = [p for p in sorted(tmp.rglob("*")) if p.is_file() and p.name != MANIFEST]
    files = {str(p.relative_to(tmp)): p.stat().st_size for p in found}
    sums = {str(p.relative_to(tmp)): file_sha256(p) for p in found}
    with writing(tmp / MANIFEST):
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files, "sha256": sums}, indent=1,
                                               sort_keys=True) + "\n")


def commit(tmp: Path, step: int, name: Optional[str] = None, pointer: str = LATEST,
           pointer_text: Optional[str] = None) -> Path:
    """Finish staging directory ``tmp``: write its manifest, sync it, rename it to ``name`` (``step_N``; replacing
    an older copy of that step), sync the directory, point ``pointer`` (``latest``: the name; verl's tracker: the
    step) at it."""
    ckpt_dir = tmp.parent
    write_manifest(tmp, step)
    crash_point(f"{tmp.name}: manifest written")
    fsync_tree(tmp)
    crash_point(f"{tmp.name}: synced")
    final = ckpt_dir / (name or step_dir_name(step))
    if final.exists():
        remove_dir(final)
    os.replace(tmp, final)
    crash_point(f"{final.name}: renamed into place")
    fsync_dir(ckpt_dir)
    atomic_write_text(ckpt_dir / pointer, (pointer_text if pointer_text is not None else final.name) + "\n")
    return final


def confirm(ckpt_dir: Path, checkpoint: Path) -> None:
    """Record ``checkpoint`` as the newest confirmed one (``last_good``)."""
    atomic_write_text(Path(ckpt_dir) / LAST_GOOD, Path(checkpoint).name + "\n")


def rotate(ckpt_dir: Path, keep: int, log: Optional[Callable[[str], None]] = None) -> List[Path]:
    """Delete all but the newest ``keep`` step directories (``keep <= 0``: keep all), never the newest confirmed
    one (``last_good``). Returns what was deleted."""
    if keep is None or keep <= 0:
        return []
    protected = last_good(ckpt_dir)
    gone = []
    for old in step_dirs(ckpt_dir)[:-keep]:
        if protected is not None and old.name == protected.name:
            continue
        remove_dir(old)
        gone.append(old)
    return gone


def remove_all(ckpt_dir: Path) -> List[Path]:
    """A fresh start: delete every step directory and the pointer files (nothing else in ``ckpt_dir``)."""
    old = step_dirs(ckpt_dir)
    for p in old:
        remove_dir(p)
    for name in POINTERS:
        (Path(ckpt_dir) / name).unlink(missing_ok=True)
    return old


def drop_after(ckpt_dir: Path, step: int, log: Callable[[str], None] = print) -> None:
    """A resume from step ``step`` abandons the checkpoints after it (else rotation, which keeps the highest
    steps, would delete the new ones and keep those)."""
    for p in step_dirs(ckpt_dir):
        if step_of(p) > step:
            remove_dir(p, log, f"after the resumed step {step}")


def find(ckpt_dir: Path, name: str, verify: bool = False, allow_unverified: bool = False,
         engine: str = "local") -> Path:
    """``trainer.resume_from``: ``last_good``, ``latest`` or a step directory's name (``step_000010``) in
    ``ckpt_dir``; raises ``FileNotFoundError`` naming the key unless it is a complete checkpoint (``verify``: whose
    files match their sha256; one that cannot be verified raises :class:`UnverifiedCheckpoint` unless
    ``allow_unverified``)."""
    ckpt_dir = Path(ckpt_dir)
    key = f"trainer.resume_from={name}"
    if name == LATEST:
        p = resume_point(ckpt_dir, log=lambda _: None, verify=verify, allow_unverified=allow_unverified,
                         engine=engine)
        if p is None:
            raise FileNotFoundError(f"{key}: no complete checkpoint in {ckpt_dir}")
        return p
    if name == LAST_GOOD:
        p = last_good(ckpt_dir)
        if p is None:
            raise FileNotFoundError(f"{key}: no confirmed checkpoint in {ckpt_dir} ({LAST_GOOD} missing or incomplete)")
    elif step_of(Path(name)) is not None and "/" not in name:
        p = ckpt_dir / name
        why = incomplete_reason(p)
        if why is not None:
            raise FileNotFoundError(f"{key}: {why} (in {ckpt_dir})")
    else:
        raise FileNotFoundError(f"{key}: not a step directory name (step_NNNNNN), last_good or latest "
                                f"(in {ckpt_dir})")
    bad = incomplete_reason(p, verify=True) if verify else None
    if bad is not None and bad.startswith("unverified"):
        if not allow_unverified:
            newer_first = [q for q in reversed(step_dirs(ckpt_dir)) if q.name != p.name]
            check_unverified(ckpt_dir, p, next((q for q in newer_first
                                                if incomplete_reason(q, verify=True) is None), None), engine)
        bad = None
    if bad is not None:
        raise FileNotFoundError(f"{key}: {p} is not loadable: {bad}")
    return p
