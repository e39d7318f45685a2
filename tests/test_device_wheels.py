"""The wheel shuttle (scripts/device_wheels.sh), dry-run on CPU with fake wheels and a 5 MiB carry limit.

No network: the wheels are built here (pure Python, one of 7 MiB so that it travels in parts). The batches
are received one "call" at a time into a stage folder, then joined, checked against the MANIFEST's sha256
and installed with pip (``--no-index --target``), as on the GPU machine.
"""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHUTTLE = REPO / "scripts" / "device_wheels.sh"
MIB = 1 << 20


def fake_wheel(folder: Path, name: str, payload: bytes = b"") -> Path:
    """A minimal valid pure-Python wheel: package ``name`` with ``VALUE`` = sha256 of ``payload`` (stored
    uncompressed as ``name/blob.bin``, so the wheel is about as large as the payload)."""
    dist = f"{name}-1.0"
    files = {
        f"{name}/__init__.py": f"VALUE = {hashlib.sha256(payload).hexdigest()!r}\n".encode(),
        f"{name}/blob.bin": payload,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}.dist-info/WHEEL": (b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    b"Tag: py3-none-any\n"),
    }
    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{path},sha256={digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for p, data in files.items():
            z.writestr(p, data)
    return path


def shuttle(*args, check=True):
    p = subprocess.run(["bash", str(SHUTTLE), *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable})
    if check and p.returncode:
        raise AssertionError(f"device_wheels.sh {args[0]} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def packed(tmp_path):
    """Three fake wheels (7 MiB, 1 MiB, tiny) packed for a 5 MiB carry limit and no working tree."""
    wheels = tmp_path / "out" / "wheels"
    wheels.mkdir(parents=True)
    big = fake_wheel(wheels, "bigpkg", os.urandom(7 * MIB))
    mid = fake_wheel(wheels, "midpkg", os.urandom(MIB))
    small = fake_wheel(wheels, "smallpkg", b"hello")
    p = shuttle("pack", tmp_path / "out", "--limit", 5, "--tree-mib", 0)
    assert "3 wheels" in p.stdout, p.stdout
    batches = sorted((tmp_path / "out").glob("batch-*"))
    return tmp_path, batches, {w.name: sha(w) for w in (big, mid, small)}


def test_parts_join_to_the_same_sha256_and_install(packed):
    tmp, batches, digests = packed
    # every batch fits the budget (5 MiB - 2 MiB margin), the big wheel travels in 3 parts across batches
    assert len(batches) >= 3
    for b in batches:
        assert sum(f.stat().st_size for f in b.iterdir()) <= 3 * MIB and (b / "MANIFEST").is_file()
    parts = sorted(f.name for b in batches for f in b.glob("bigpkg-*.part*"))
    assert parts == [f"bigpkg-1.0-py3-none-any.whl.part{i:02d}-of-03" for i in range(3)]
    assert len({f.parent for b in batches for f in b.glob("bigpkg-*.part*")}) >= 2
    stage, target = tmp / "stage", tmp / "site"
    # one batch per call: until the last one arrives, the stage says what is missing and install refuses
    for b in batches[:-1]:
        shuttle("receive", b, stage)
    p = shuttle("missing", stage, check=False)
    assert p.returncode == 1 and p.stdout.strip()
    p = shuttle("install", stage, target, check=False)
    assert p.returncode == 2 and "missing" in p.stderr and not target.exists()
    shuttle("receive", batches[-1], stage)
    assert shuttle("missing", stage).returncode == 0
    shuttle("install", stage, target)
    joined = stage / "joined"
    assert {w.name: sha(w) for w in joined.glob("*.whl")} == digests  # parts joined to the original bytes
    code = "import bigpkg, midpkg, smallpkg; print(bigpkg.__file__, bigpkg.VALUE == __import__('hashlib')" \
           ".sha256(open(bigpkg.__file__.replace('__init__.py', 'blob.bin'), 'rb').read()).hexdigest())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(target)}).stdout
    assert out.startswith(str(target)) and out.strip().endswith("True")


def test_a_damaged_part_or_another_pack_is_refused(packed):
    tmp, batches, _ = packed
    stage = tmp / "stage"
    for b in batches:
        shuttle("receive", b, stage)
    part = next(stage.glob("bigpkg-*.part01-of-03"))
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    p = shuttle("install", stage, tmp / "site", check=False)
    assert p.returncode == 2 and "bigpkg-1.0-py3-none-any.whl: sha256" in p.stderr
    assert not (tmp / "site").exists()
    # a batch of another pack (another MANIFEST) is not mixed into this stage
    other = tmp / "other"
    (other / "wheels").mkdir(parents=True)
    fake_wheel(other / "wheels", "otherpkg", b"x")
    shuttle("pack", other, "--limit", 5, "--tree-mib", 0)
    p = shuttle("receive", other / "batch-01", stage, check=False)
    assert p.returncode == 2 and "two packs" in p.stderr


def test_the_budget_leaves_room_for_the_working_tree(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import device_wheels as dw
    finally:
        sys.path.pop(0)
    assert dw.batch_budget(64, 23 * MIB) == (64 - 23 - dw.MARGIN_MIB) * MIB
    with pytest.raises(ValueError, match="--limit 5"):
        dw.batch_budget(5, 3 * MIB)
    assert dw.travelling_tree_bytes() > 0  # this checkout's tracked files
    req = tmp_path / "req.txt"
    req.write_text("# comment\nray==2.60.0\nantlr4-python3-runtime==4.9.3  # sdist: pure\n\n")
    assert dw.read_requirements(req) == (["ray==2.60.0"], ["antlr4-python3-runtime==4.9.3"])
    shipped = dw.read_requirements(REPO / "scripts" / "device_wheels.txt")
    assert "verl==0.9.1" in shipped[0] and any(s.startswith("ray==") for s in shipped[0])
    assert not any(s.startswith(("torch==", "numpy==")) for s in shipped[0])  # the GPU image has these
