"""Make token shards in the Modded-NanoGPT `.bin` format from text every Python machine has.

The text is the standard library's own `.py` sources, read in sorted order; tokens are
bytes (ids 0-255), so no tokenizer and nothing downloaded. Deterministic and idempotent:
an existing shard of the requested size is left alone.

    python data/make_shards.py [--train-tokens N] [--val-tokens N]
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

import numpy as np

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HERE = Path(__file__).resolve().parent


def stdlib_bytes(limit: int) -> bytes:
    """The first `limit` bytes of the standard library's sources, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        out.append(data)
        size += len(data)
        if size >= limit:
            break
    blob = b"".join(out)
    if len(blob) < limit:
        raise SystemExit(f"only {len(blob)} bytes of stdlib source found under {root}; need {limit}")
    return blob[:limit]


def write_shard(path: Path, tokens: np.ndarray) -> None:
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (MAGIC, VERSION, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())


def read_header(path: Path) -> tuple[int, int, int]:
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    return int(header[0]), int(header[1]), int(header[2])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-tokens", type=int, default=4_000_000)
    p.add_argument("--val-tokens", type=int, default=200_000)
    p.add_argument("--out", type=Path, default=HERE)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    blob = np.frombuffer(stdlib_bytes(a.val_tokens + a.train_tokens), dtype=np.uint8)
    shards = {"val_000000.bin": blob[: a.val_tokens], "train_000000.bin": blob[a.val_tokens:]}
    for name, toks in shards.items():
        path = a.out / name
        if path.exists() and read_header(path) == (MAGIC, VERSION, len(toks)):
            print(f"{path}: up to date ({len(toks):,} tokens)")
            continue
        write_shard(path, toks)
        print(f"{path}: wrote {len(toks):,} byte tokens")


if __name__ == "__main__":
    main(sys.argv[1:])
