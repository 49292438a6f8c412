"""Token shards in the records' format: the reader and writer, the header checks, BOS at
every document start, a BOS-aligned batch finder, shards made from the standard library's
sources, and user shards given with `--shards`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainbridge.records.shards import (FORMAT, ShardError, bos_batch, bos_positions, check_shards, load_words,
                                        make_record_shards, read_header, read_shard, shard_bytes, write_shard)

BOS = 50256


def _stdlib_like(root: Path) -> Path:
    """A small source tree in the standard library's layout (fast to tokenize)."""
    for i in range(40):
        body = "\n".join(f"def function_{i}_{j}(value, other=None):\n    '''Return value {j}.'''\n"
                         f"    return value + {j} if other is None else other\n" for j in range(30))
        path = root / ("pkg" if i % 3 else "") / f"module_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"import os\nimport sys\n\n{body}\n")
    site = root / "site-packages" / "big.py"  # installed packages are not the standard library
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text("x = 1\n" * 10000)
    return root


def test_round_trip_and_header(tmp_path):
    tokens = np.array([BOS, 5, 300, 50255, BOS, 7], dtype=np.int64)
    path = tmp_path / "train_000000.bin"
    assert write_shard(path, tokens) and not write_shard(path, tokens), "the same content is not rewritten"
    assert path.stat().st_size == 1024 + 2 * tokens.size
    header = read_header(path)
    assert (header.magic, header.version, header.num_tokens) == (20240520, 1, 6)
    assert read_shard(path).tolist() == tokens.tolist()
    raw = np.fromfile(path, dtype="<i4", count=256)
    assert raw[:3].tolist() == [20240520, 1, 6] and not raw[3:].any()
    with pytest.raises(ShardError, match="uint16"):
        shard_bytes(np.array([70000]))


@pytest.mark.parametrize("field,value,message", [(0, 12345, "magic number 12345, expected 20240520"),
                                                 (1, 2, "format version 2"),
                                                 (2, 99, "says 99 tokens, the file holds 6")])
def test_header_checks_name_the_file(tmp_path, field, value, message):
    path = tmp_path / "val_000000.bin"
    write_shard(path, np.array([BOS, 1, 2, 3, 4, 5]))
    data = bytearray(path.read_bytes())
    data[4 * field: 4 * field + 4] = np.array([value], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=message) as err:
        read_header(path)
    assert str(path) in str(err.value)


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "train_000000.bin"
    path.write_bytes(b"\0" * 100)
    with pytest.raises(ShardError, match="shorter than the 1024-byte header"):
        read_header(path)


def test_bos_batch_finder_finds_documents():
    # three documents of 5, 3 and 6 tokens, then a 4-token one
    docs = [[BOS, 1, 2, 3, 4], [BOS, 5, 6], [BOS, 7, 8, 9, 10, 11], [BOS, 12, 13, 14]]
    tokens = np.array([t for d in docs for t in d])
    segments, after = bos_batch(tokens, 0, 7)  # 8 tokens: the first document and the second
    assert segments == [(0, 5), (5, 8)] and after == 8
    assert all(tokens[b] == BOS for b, _ in segments)
    segments, after = bos_batch(tokens, 1, 5)  # from inside a document: the next BOS
    assert segments == [(5, 8), (8, 11)] and after == 11
    segments, _ = bos_batch(tokens, 0, 7, max_doc_tokens=3)  # long documents contribute a prefix
    assert segments == [(0, 3), (5, 8), (8, 10)]
    with pytest.raises(StopIteration):
        bos_batch(tokens, 9, 10)


def test_make_record_shards_from_source_files(tmp_path):
    root = _stdlib_like(tmp_path / "lib")
    out = make_record_shards(tmp_path / "data", train_tokens=20000, val_tokens=3000, max_doc_tokens=128,
                             source_root=root)
    found = check_shards(out)
    assert sum(s.num_tokens for s in found.train) == 20000 and [s.num_tokens for s in found.val] == [3000]
    # two training files (the 2026 records preload the second as they open the first), cut at a
    # document start, about half each
    assert [Path(s.path).name for s in found.train] == ["train_000000.bin", "train_000001.bin"]
    assert all(abs(s.num_tokens - 10000) <= 128 for s in found.train)
    for s in found.train + found.val:
        assert s.starts_with_bos and s.max_id <= BOS and s.documents > 10
        assert s.doc_tokens_max <= 128, "documents are capped for the scaled batch"
        assert s.doc_tokens_min >= 16
    train = read_shard(out / "train_000000.bin")
    assert int(train[train != BOS].max()) < BOS, "body ids stay below BOS: 50256 only starts documents"
    body = train[train != BOS]
    assert (body >= 256).mean() > 0.5 and len(np.unique(body[body >= 256])) > 40, "mostly word ids, not bytes"
    words = load_words(out)
    text = words.decode(train[: bos_positions(train)[3]])
    assert "def function_" in text and "return value" in text, "the ids decode back to the source"
    # each document is a piece of one file: it starts at a top-level statement
    starts = bos_positions(train)[:-1]
    assert all(words.decode(train[b + 1: b + 3]).lstrip("\n")[:1] in "dimp" for b in starts[:20])
    # the same call again leaves the files alone and is fast
    stamp = (out / "train_000000.bin").stat().st_mtime_ns
    assert make_record_shards(tmp_path / "data", train_tokens=20000, val_tokens=3000, max_doc_tokens=128,
                              source_root=root) == out
    assert (out / "train_000000.bin").stat().st_mtime_ns == stamp
    # asked for one file: remade as one, the second file gone
    make_record_shards(tmp_path / "data", train_tokens=20000, val_tokens=3000, max_doc_tokens=128,
                       source_root=root, train_files=1)
    assert [Path(s.path).name for s in check_shards(out).train] == ["train_000000.bin"]


def test_validation_comes_from_other_files(tmp_path):
    root = _stdlib_like(tmp_path / "lib")
    out = make_record_shards(tmp_path / "d", train_tokens=15000, val_tokens=3000, max_doc_tokens=128,
                             source_root=root)
    words = load_words(out)
    names = {}
    for split in ("train", "val"):
        text = words.decode(read_shard(out / f"{split}_000000.bin"))
        names[split] = {w for w in text.split() if w.startswith("function_")}
    funcs_per_file = lambda ns: {n.split("_")[1] for n in ns}  # noqa: E731
    assert not funcs_per_file(names["train"]) & funcs_per_file(names["val"]), "no source file in both splits"


def test_too_little_text_is_a_clear_error(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    with pytest.raises(ShardError, match="asked for"):
        make_record_shards(tmp_path / "d", train_tokens=10000, val_tokens=100, source_root=root)


def test_user_shards_are_validated(tmp_path):
    # real FineWeb shards: documents of GPT-2 ids, each after BOS, in the same format
    user = tmp_path / "fineweb10B"
    user.mkdir()
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[BOS], rng.integers(0, BOS, size=n)]) for n in rng.integers(50, 900, size=40)]
    write_shard(user / "fineweb_train_000001.bin", np.concatenate(docs))  # not our names: rejected below
    with pytest.raises(ShardError, match="no train_\\*.bin and val_\\*.bin"):
        check_shards(user)
    write_shard(user / "train_000001.bin", np.concatenate(docs))
    write_shard(user / "val_000000.bin", np.concatenate(docs[:5]))
    found = check_shards(user)
    assert found.train[0].documents == 40 and found.val_tokens == sum(len(d) for d in docs[:5])
    assert found.notes == []
    (user / "train_000002.bin").write_bytes(np.zeros(256, dtype="<i4").tobytes())  # a wrong magic
    with pytest.raises(ShardError, match="train_000002.bin: magic number 0, expected 20240520"):
        check_shards(user)


def test_shards_without_bos_are_flagged_and_ids_above_the_vocabulary_refused(tmp_path):
    write_shard(tmp_path / "train_000000.bin", np.arange(1000) % 256)  # byte shards: no BOS at all
    write_shard(tmp_path / "val_000000.bin", np.arange(100) % 256)
    found = check_shards(tmp_path)
    assert any("no BOS" in n for n in found.notes)
    write_shard(tmp_path / "val_000000.bin", np.array([BOS, 60000]))
    with pytest.raises(ShardError, match="token id 60000 >= 50257"):
        check_shards(tmp_path)


def test_format_facts():
    assert (FORMAT.magic, FORMAT.version, FORMAT.header_ints, FORMAT.bos_id, FORMAT.vocab_size) == \
        (20240520, 1, 256, 50256, 50257)


def test_stdlib_shards_feed_a_scaled_run(tmp_path):
    """The shipped defaults on this Python's standard library: 300 steps of 1024 tokens find
    documents (several per step) the way the BOS-aligned records do, never running dry."""
    out = make_record_shards(tmp_path, train_tokens=400_000, val_tokens=8192)
    train = np.concatenate([read_shard(p) for p in sorted(out.glob("train_*.bin"))])
    bos = bos_positions(train)
    pos, docs = 0, []
    for _ in range(300):
        segments, pos = bos_batch(train, pos, 1024, max_doc_tokens=1024, bos=bos)
        docs.append(len(segments))
    assert min(docs) >= 2 and np.mean(docs) >= 3
    gaps = np.diff(bos)
    assert gaps.max() <= 384, "a document boundary within every 2 x 1024-token span (record 26's finder)"
