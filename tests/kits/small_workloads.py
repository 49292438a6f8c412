"""Copies of the shipped workloads, made small enough for a CI minute.

The program files are the shipped ones, unchanged; only the manifest's `args`, step counts,
work per step and shard sizes shrink (2 layers, width 64, seq 64, batch 4: 256 tokens a step).
"""

import re
import shutil
from pathlib import Path

from tests.kits.paths import WORKLOADS

NANOGPT = WORKLOADS / "nanogpt"
TINY_NANOGPT_ARGS = ('args = ["n_layer=2", "n_head=2", "n_embd=64", "vocab_size=256", "seq_len=64", "batch_size=4", '
                     '"num_iterations=200", "val_loss_every=0", "val_tokens=1024", "timing_skip_steps=3"]')


def small_nanogpt(tmp: Path) -> Path:
    """nanogpt's folder copied under `tmp` with the tiny configuration (2 warm-up, 5 measured steps,
    6 timed, no later-window check)."""
    work = tmp / "nanogpt"
    shutil.copytree(NANOGPT, work, ignore=shutil.ignore_patterns("*.bin", "__pycache__"))
    toml = work / "trainbridge.toml"
    text, n = re.subn(r"(?ms)^args = \[.*?\]\n", TINY_NANOGPT_ARGS + "\n", toml.read_text())
    assert n == 1, "nanogpt's manifest has no args list to replace"
    text = text.replace("per_step = 2048", "per_step = 256")
    text = text.replace("warmup = 3\nmeasured = 10", "warmup = 2\nmeasured = 5")
    text = text.replace("timed = 50", "timed = 6")  # the timed-steps path, at CI size
    text = text.replace('command = ["python", "data/make_shards.py"]',
                        'command = ["python", "data/make_shards.py", "--train-tokens", "300000", "--val-tokens", "20000"]')
    assert "measured = 5" in text and "timed = 6" in text and "300000" in text and "per_step = 256" in text, \
        "nanogpt's manifest changed shape"
    # no later-window check: it trains the baseline once and runs every candidate once more, two
    # process start-ups a candidate that the tests using this copy do not look at (the check has
    # its own tests, and the minigpt loop tests keep it on)
    text = text.replace("[correctness]\nsteps = 8\n", "[correctness]\nsteps = 8\ntrained_steps = 0\n")
    assert "trained_steps = 0" in text, "nanogpt's manifest changed shape"
    toml.write_text(text)
    return work
