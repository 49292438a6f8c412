"""A record that reads the tokenizer gets one for the ids our shards hold, and nothing downloads.

The program is ours, in record 88's form: a prefix-token table built from
`tiktoken.get_encoding("gpt2")._mergeable_ranks` (each token's longest proper byte prefix
that is itself a token), then used on the shard's tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from trainbridge.records.shards import load_words, make_record_shards, read_shard
from trainbridge.records.tokenizer_standin import write_standin

PREFIX_PROGRAM = r'''
import json, sys
import numpy as np
import tiktoken

def build_prefix_table(vocab_size):
    enc = tiktoken.get_encoding("gpt2")
    byte_to_id = enc._mergeable_ranks
    table = [-1] * vocab_size
    for b, tid in byte_to_id.items():
        for k in range(len(b) - 1, 0, -1):
            pid = byte_to_id.get(b[:k])
            if pid is not None:
                table[tid] = pid
                break
    return table, enc

table, enc = build_prefix_table(50304)
tokens = np.fromfile("data/train_000000.bin", dtype=np.uint16, offset=256 * 4)
sample = "def read(self, path):\n    return open(path).read()  # caf\u00e9, 1024 bytes"
ids = enc.encode(sample)
json.dump({"table": table, "module": tiktoken.__file__, "ids": ids, "back": enc.decode(ids), "sample": sample,
           "eot": enc.eot_token, "max_token": int(tokens.max())}, sys.stdout)
'''


def test_a_prefix_table_program_runs_on_the_shards_vocabulary(tmp_path):
    shards = make_record_shards(tmp_path / "shards", train_tokens=20_000, val_tokens=4096)
    dest = tmp_path / "workload"
    (dest / "data").mkdir(parents=True)
    for f in shards.glob("*.bin"):
        (dest / "data" / f.name).symlink_to(f)
    (dest / "train_gpt.py").write_text(PREFIX_PROGRAM)
    note = write_standin(dest, shards, [PREFIX_PROGRAM])
    assert note and "stand-in" in note and (dest / "tiktoken.py").is_file()
    proc = subprocess.run([sys.executable, "train_gpt.py"], cwd=dest, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(dest)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert Path(out["module"]).resolve() == (dest / "tiktoken.py").resolve() and out["eot"] == 50256
    words = load_words(shards)
    table = out["table"]
    # every word id whose bytes have a proper prefix in the vocabulary maps to the longest one
    by_bytes = {bytes([b]): b for b in range(256)}
    for i, w in enumerate(words.words):
        by_bytes.setdefault(w.encode("utf-8"), 256 + i)
    checked = 0
    for i, w in enumerate(words.words[:400]):
        b = w.encode("utf-8")
        if by_bytes[b] != 256 + i:
            continue  # a one-byte word: the byte id owns those bytes
        want = next((by_bytes[b[:k]] for k in range(len(b) - 1, 0, -1) if b[:k] in by_bytes), -1)
        assert table[256 + i] == want, (w, table[256 + i], want)
        checked += want != -1
    assert checked > 50  # the table is not all -1: multi-byte words have prefixes
    # the stand-in encodes text into the ids the shards were written with, and back
    assert out["ids"] == words.encode(out["sample"]) and out["back"] == out["sample"]
    assert any(i >= 256 for i in out["ids"])
    assert out["max_token"] == int(np.max(read_shard(shards / "train_000000.bin")))


def test_no_stand_in_without_a_tiktoken_import_or_on_the_users_shards(tmp_path):
    shards = make_record_shards(tmp_path / "shards", train_tokens=20_000, val_tokens=4096)
    assert write_standin(tmp_path, shards, ["import torch\n# tiktoken is mentioned only in a comment\n"]) is None
    users = tmp_path / "fineweb"  # GPT-2 shards of the user's: no shards.json of ours
    users.mkdir()
    for f in shards.glob("*.bin"):
        (users / f.name).write_bytes(f.read_bytes())
    assert write_standin(tmp_path, users, ["import tiktoken\n"]) is None
    assert not (tmp_path / "tiktoken.py").exists()
