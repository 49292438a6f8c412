"""Make `train_000000.bin` and `val_000000.bin` from text every Python installation has.

The text is the standard library's own `.py` sources (`sysconfig.get_paths()['stdlib']`,
without site-packages), read in sorted path order and concatenated; one token per byte
(ids 0-255, so the model's vocab_size must be at least 256). The validation shard takes
the first --val-tokens bytes, the training shard the next --train-tokens. Nothing is
downloaded, the result is the same on every run with the same Python, and a shard that
already holds exactly the tokens it should is left untouched.

Shard format (the Modded-NanoGPT records', read by `train_llama.py`): 256 little-endian
int32 (magic 20240520, version 1, token count, then zeros), then the tokens as
little-endian uint16.

    python data/make_shards.py [--train-tokens N] [--val-tokens N] [--out-dir DIR]

Standard library only (no numpy, no torch).
"""

from __future__ import annotations

import argparse
import os
import struct
import sysconfig
from pathlib import Path

MAGIC = 20240520  # first header int32
VERSION = 1  # second header int32
HEADER_INTS = 256  # header length in int32 (1024 bytes)
HERE = Path(__file__).resolve().parent
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}  # installed packages are not the stdlib


def stdlib_text(num_bytes: int, root: Path | None = None) -> bytes:
    """The first num_bytes bytes of the concatenated stdlib sources, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]  # prune: site-packages can be huge
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    paths = sorted(found, key=lambda p: p.relative_to(root).as_posix())
    chunks, size = [], 0
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:  # unreadable file: skipped the same way on every run
            continue
        chunks.append(data)
        size += len(data)
        if size >= num_bytes:
            break
    if size < num_bytes:
        raise SystemExit(f"only {size:,} bytes of .py source under {root}; asked for {num_bytes:,} "
                         f"(lower --train-tokens / --val-tokens)")
    return b"".join(chunks)[:num_bytes]


def shard_bytes(tokens: bytes | bytearray | list[int]) -> bytes:
    """A whole shard file's content for these token ids (each 0-65535)."""
    header = struct.pack(f"<{HEADER_INTS}i", MAGIC, VERSION, len(tokens), *([0] * (HEADER_INTS - 3)))
    if isinstance(tokens, (bytes, bytearray)):  # byte tokens: low byte is the byte, high byte 0
        body = bytearray(2 * len(tokens))
        body[0::2] = tokens
    else:
        if any(not 0 <= t < 2**16 for t in tokens):
            raise ValueError("token ids must fit in uint16 (0-65535)")
        body = struct.pack(f"<{len(tokens)}H", *tokens)
    return header + bytes(body)


def write_shard(path: Path, tokens: bytes | bytearray | list[int]) -> bool:
    """Write a shard atomically; False (and nothing written) when the file already matches."""
    content = shard_bytes(tokens)
    path = Path(path)
    if path.is_file() and path.stat().st_size == len(content) and path.read_bytes() == content:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Byte-token shards from the Python standard library's sources.")
    p.add_argument("--train-tokens", type=int, default=4_000_000, help="tokens (bytes) in train_000000.bin")
    p.add_argument("--val-tokens", type=int, default=200_000, help="tokens (bytes) in val_000000.bin")
    p.add_argument("--out-dir", type=Path, default=HERE, help="folder for the shards (default: this one)")
    a = p.parse_args(argv)
    if a.train_tokens < 1 or a.val_tokens < 1:
        p.error("--train-tokens and --val-tokens must be positive")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    text = stdlib_text(a.val_tokens + a.train_tokens)
    for name, tokens in (("val_000000.bin", text[: a.val_tokens]), ("train_000000.bin", text[a.val_tokens:])):
        path = a.out_dir / name
        if write_shard(path, tokens):
            print(f"{path}: wrote {len(tokens):,} byte tokens")
        else:
            print(f"{path}: up to date ({len(tokens):,} tokens)")


if __name__ == "__main__":
    main()
