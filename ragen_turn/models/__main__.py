"""python -m ragen_turn.models export NAME DIR [--dtype float32|bfloat16] [--set key=value ...] [--force]

Writes the Hugging Face directory of `tiny` or `smollm2-135m` to DIR, so that `model.path=DIR` works in any engine
(`AutoModelForCausalLM.from_pretrained(DIR)` / `AutoTokenizer.from_pretrained(DIR)`).
`--set` passes tiny's config keys, e.g. `--set hidden_size=256 --set num_hidden_layers=4 --set seed=1`.

python -m ragen_turn.models info NAME [--set key=value ...]   prints the cached directory, parameter count, times.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _parse_sets(items):
    cfg = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value
    return cfg


def main(argv=None) -> int:
    from . import KNOWN_MODELS, _timed_load, export_model, resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m ragen_turn.models")
    sub = parser.add_subparsers(dest="cmd", required=True)
    exp = sub.add_parser("export", help="write a model's Hugging Face directory")
    exp.add_argument("name", choices=[n for n in KNOWN_MODELS if n != "hf"])
    exp.add_argument("dir")
    exp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    exp.add_argument("--set", action="append", metavar="KEY=VALUE", help="model config key (tiny)")
    exp.add_argument("--force", action="store_true", help="overwrite a non-empty DIR")
    info = sub.add_parser("info", help="build/convert if needed, then print where it is and what it is")
    info.add_argument("name", choices=[n for n in KNOWN_MODELS if n != "hf"])
    info.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    info.add_argument("--set", action="append", metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    cfg = {**_parse_sets(args.set), "name": args.name}
    if args.cmd == "export":
        t0 = time.perf_counter()
        dest = export_model(args.name, args.dir, dtype=args.dtype, model_cfg=cfg, overwrite=args.force)
        print(f"wrote {args.name} ({args.dtype}) to {dest} in {time.perf_counter() - t0:.1f} s; "
              f"use it with model.path={dest}")
        return 0
    t0 = time.perf_counter()
    path = resolve_model_path(cfg, dtype=args.dtype)
    t_build = time.perf_counter() - t0
    model, tok, t_load = _timed_load(cfg, dtype=args.dtype)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"name": args.name, "dir": str(path), "build_or_find_s": round(t_build, 3),
                      "load_s": round(t_load, 3), "params": n, "vocab": len(tok),
                      "model_class": type(model).__name__}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
