"""Make a CIFAR-10-shaped image set locally: 10 classes of 32x32 RGB images, uint8.

Nothing is downloaded. Each class is a fixed random template (a low-frequency colour
pattern: 4x4 random RGB values upsampled bilinearly to 32x32, plus a class colour cast).
An image of class c is its template, shifted by up to --max-shift pixels (wrapping),
flipped left-right with probability 1/2, with a random brightness/contrast change, mixed
with a random distractor pattern of another class (weight up to 0.35) and Gaussian noise.
So the classes are learnable but not trivially separable from the mean colour alone.

Files (numpy `.npy`, same layout as CIFAR-10's arrays):

    train_images.npy  uint8 (N_train, 32, 32, 3)    train_labels.npy  int64 (N_train,)
    test_images.npy   uint8 (N_test, 32, 32, 3)     test_labels.npy   int64 (N_test,)

The result depends only on --seed and the sizes; a file that already holds exactly the
bytes it should is left untouched.

    python data/make_data.py [--train N] [--test N] [--seed S] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
NUM_CLASSES = 10
SIZE = 32  # image height and width in pixels
FILES = ("train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy")


def _upsample(grid: np.ndarray, size: int) -> np.ndarray:
    """Bilinear upsampling of (k, k, 3) to (size, size, 3), align-corners style."""
    k = grid.shape[0]
    pos = np.linspace(0, k - 1, size)
    i0 = np.floor(pos).astype(int).clip(0, k - 2)
    f = (pos - i0)[:, None]
    rows = grid[i0] * (1 - f)[:, :, None] + grid[i0 + 1] * f[:, :, None]  # (size, k, 3)
    cols = rows[:, i0] * (1 - f)[None, :, :] + rows[:, i0 + 1] * f[None, :, :]
    return cols


def class_templates(rng: np.random.Generator) -> np.ndarray:
    """(10, 32, 32, 3) float templates in [0, 1]."""
    out = []
    for _ in range(NUM_CLASSES):
        pattern = _upsample(rng.uniform(0, 1, (4, 4, 3)), SIZE)
        cast = rng.uniform(0.2, 0.8, 3)
        out.append(0.6 * pattern + 0.4 * cast)
    return np.stack(out)


def make_split(n: int, templates: np.ndarray, rng: np.random.Generator, max_shift: int, noise: float):
    """n images (uint8 NHWC) and labels (int64), classes balanced then shuffled."""
    labels = rng.permutation(np.arange(n) % NUM_CLASSES).astype(np.int64)
    images = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        x = templates[c]
        dy, dx = rng.integers(-max_shift, max_shift + 1, 2)
        x = np.roll(x, (dy, dx), axis=(0, 1))
        if rng.random() < 0.5:
            x = x[:, ::-1]
        other = templates[(c + rng.integers(1, NUM_CLASSES)) % NUM_CLASSES]
        other = np.roll(other, tuple(rng.integers(0, SIZE, 2)), axis=(0, 1))
        w = rng.uniform(0, 0.35)
        x = (1 - w) * x + w * other
        x = (x - 0.5) * rng.uniform(0.7, 1.3) + 0.5 + rng.uniform(-0.1, 0.1)  # contrast, brightness
        x = x + rng.normal(0, noise, x.shape)
        images[i] = np.clip(np.rint(x * 255), 0, 255).astype(np.uint8)
    return images, labels


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_array(path: Path, array: np.ndarray) -> bool:
    """Write an .npy atomically; False (and nothing written) when the file already matches."""
    content = _npy_bytes(array)
    path = Path(path)
    if path.is_file() and path.stat().st_size == len(content) and path.read_bytes() == content:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A synthetic CIFAR-10-shaped image set (10 classes, 3x32x32).")
    p.add_argument("--train", type=int, default=10_000, help="training images")
    p.add_argument("--test", type=int, default=2_000, help="test images")
    p.add_argument("--seed", type=int, default=0, help="numpy seed of the templates and images")
    p.add_argument("--max-shift", type=int, default=4, help="largest random shift of a template, pixels")
    p.add_argument("--noise", type=float, default=0.08, help="std of the per-pixel Gaussian noise (0-1 scale)")
    p.add_argument("--out-dir", type=Path, default=HERE, help="folder for the .npy files (default: this one)")
    a = p.parse_args(argv)
    if a.train < NUM_CLASSES or a.test < NUM_CLASSES:
        p.error(f"--train and --test must be at least {NUM_CLASSES}")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    templates = class_templates(rng)
    train = make_split(a.train, templates, rng, a.max_shift, a.noise)
    test = make_split(a.test, templates, rng, a.max_shift, a.noise)
    for name, array in zip(FILES, (*train, *test)):
        path = a.out_dir / name
        status = "wrote" if write_array(path, array) else "up to date"
        print(f"{path}: {status} {array.dtype} {tuple(array.shape)}")


if __name__ == "__main__":
    main()
