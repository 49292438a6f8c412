"""Make image-caption pairs locally for contrastive (CLIP-style) training.

Nothing is downloaded. Each pair comes from four random attributes:

    size      small, big
    colour    red, green, blue, yellow, magenta, cyan, white, orange
    shape     square, circle, triangle, cross
    position  top left, top right, bottom left, bottom right, center

The image (32x32 RGB, uint8) is a dark noisy background with the shape drawn by numpy in
that colour (slightly jittered in shade), at that position (jittered by a few pixels) and
size (jittered too). The caption is the same attributes as words, "a big red square in
the top left", as token ids: <sot> words <eot>, then <pad> (id 0) up to --context-length.
<eot> is the largest id, so a text model can find it with `argmax` (as CLIP does).

Files (numpy `.npy`, and the vocabulary as JSON):

    train_images.npy  uint8 (N_train, 32, 32, 3)    train_tokens.npy  int64 (N_train, context_length)
    val_images.npy    uint8 (N_val, 32, 32, 3)      val_tokens.npy    int64 (N_val, context_length)
    vocab.json        {"tokens": [word for id 0, 1, ...]}

The result depends only on --seed and the sizes; a file that already holds exactly the
bytes it should is left untouched.

    python data/make_data.py [--train N] [--val N] [--context-length L] [--seed S] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIZE = 32  # image height and width in pixels
SIZES = ["small", "big"]
COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (230, 220, 50),
           "magenta": (210, 50, 200), "cyan": (50, 210, 220), "white": (235, 235, 235), "orange": (240, 140, 30)}
SHAPES = ["square", "circle", "triangle", "cross"]
POSITIONS = {"top left": (9, 9), "top right": (9, 23), "bottom left": (23, 9), "bottom right": (23, 23),
             "center": (16, 16)}  # (row, column) of the shape's centre
WORDS = ["a", "in", "the"] + SIZES + list(COLOURS) + SHAPES + ["top", "bottom", "left", "right", "center"]
VOCAB = ["<pad>"] + WORDS + ["<sot>", "<eot>"]  # <eot> last: the largest id
TOKEN_ID = {w: i for i, w in enumerate(VOCAB)}
FILES = ("train_images.npy", "train_tokens.npy", "val_images.npy", "val_tokens.npy", "vocab.json")


def caption(size: str, colour: str, shape: str, position: str) -> str:
    return f"a {size} {colour} {shape} in the {position}"


def tokenize(text: str, context_length: int) -> np.ndarray:
    ids = [TOKEN_ID["<sot>"]] + [TOKEN_ID[w] for w in text.split()] + [TOKEN_ID["<eot>"]]
    if len(ids) > context_length:
        raise ValueError(f"{text!r} needs {len(ids)} tokens, more than context_length {context_length}")
    return np.array(ids + [TOKEN_ID["<pad>"]] * (context_length - len(ids)), dtype=np.int64)


def shape_mask(shape: str, cy: float, cx: float, radius: float) -> np.ndarray:
    """Boolean (32, 32) mask of the shape centred at (cy, cx) with half-size radius (pixels)."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5
    dy, dx = yy - cy, xx - cx
    if shape == "square":
        return (np.abs(dy) <= radius) & (np.abs(dx) <= radius)
    if shape == "circle":
        return dy ** 2 + dx ** 2 <= radius ** 2
    if shape == "triangle":  # apex up: width grows linearly from top to bottom
        return (dy >= -radius) & (dy <= radius) & (np.abs(dx) <= (dy + radius) / 2)
    if shape == "cross":
        arm = max(1.0, radius / 3)
        return ((np.abs(dy) <= arm) & (np.abs(dx) <= radius)) | ((np.abs(dx) <= arm) & (np.abs(dy) <= radius))
    raise ValueError(f"unknown shape {shape!r}")


def make_split(n: int, context_length: int, rng: np.random.Generator):
    """n images (uint8 NHWC) and their caption tokens (int64 (n, context_length))."""
    images = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    tokens = np.empty((n, context_length), dtype=np.int64)
    positions = list(POSITIONS)
    for i in range(n):
        size = SIZES[rng.integers(len(SIZES))]
        colour = list(COLOURS)[rng.integers(len(COLOURS))]
        shape = SHAPES[rng.integers(len(SHAPES))]
        position = positions[rng.integers(len(positions))]
        radius = (3.0 if size == "small" else 6.0) + rng.uniform(-0.7, 0.7)
        cy, cx = np.array(POSITIONS[position], dtype=np.float64) + rng.uniform(-2, 2, 2)
        background = rng.uniform(10, 60, 3) + rng.normal(0, 12, (SIZE, SIZE, 3))
        rgb = np.array(COLOURS[colour], dtype=np.float64) + rng.uniform(-20, 20, 3)
        mask = shape_mask(shape, cy, cx, radius)[:, :, None]
        image = np.where(mask, rgb + rng.normal(0, 8, (SIZE, SIZE, 3)), background)
        images[i] = np.clip(np.rint(image), 0, 255).astype(np.uint8)
        tokens[i] = tokenize(caption(size, colour, shape, position), context_length)
    return images, tokens


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_file(path: Path, content: bytes) -> bool:
    """Write atomically; False (and nothing written) when the file already matches."""
    path = Path(path)
    if path.is_file() and path.stat().st_size == len(content) and path.read_bytes() == content:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Synthetic image-caption pairs (shapes and their descriptions).")
    p.add_argument("--train", type=int, default=20_000, help="training pairs")
    p.add_argument("--val", type=int, default=1_000, help="validation pairs")
    p.add_argument("--context-length", type=int, default=16, help="caption length in tokens, padded")
    p.add_argument("--seed", type=int, default=0, help="numpy seed")
    p.add_argument("--out-dir", type=Path, default=HERE, help="folder for the files (default: this one)")
    a = p.parse_args(argv)
    if a.train < 1 or a.val < 1:
        p.error("--train and --val must be positive")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    train = make_split(a.train, a.context_length, rng)
    val = make_split(a.val, a.context_length, rng)
    contents = [_npy_bytes(x) for x in (*train, *val)]
    contents.append((json.dumps({"tokens": VOCAB}, indent=1) + "\n").encode())
    for name, content in zip(FILES, contents):
        path = a.out_dir / name
        status = "wrote" if write_file(path, content) else "up to date"
        print(f"{path}: {status} ({len(content):,} bytes)")


if __name__ == "__main__":
    main()
