"""Token shards in the records' format, with the token ids their scripts rely on.

Format (the Modded-NanoGPT records' `train_*.bin` / `val_*.bin`): a header of 256
little-endian int32 (magic 20240520, version 1, token count, zeros), then the tokens as
little-endian uint16 GPT-2 ids. Scripts from record 26 on align batches to BOS tokens
(id 50256, GPT-2's `<|endoftext|>`, which starts every FineWeb document) and build
document masks / varlen boundaries from them; all of them size their embeddings for
GPT-2's 50,257 ids. So a shard we make must put BOS 50256 at every document start and keep
every other id below 50256; ids 50256..50303 never occur in the text.

We cannot download FineWeb or GPT-2's tokenizer, so `make_record_shards` writes shards from
text every Python installation has, the standard library's `.py` sources:

- documents: one per source file (sorted paths, a fixed shuffle), cut at top-level
  statements into pieces of at most `max_doc_tokens` tokens when the file is longer, each
  piece a document starting with BOS. The cap matters: the record-26 style batch finder
  needs a document boundary within twice the batch, and a scaled step has ~1K tokens where
  the records had 48K per GPU;
- token ids: a deterministic word-level assignment, not GPT-2's merges. The text is split
  into GPT-2-style pieces (a word with its leading space, a number, a run of punctuation,
  whitespace); the most frequent pieces of the corpus get ids 256.. in order of frequency
  (ties by the piece), up to id 50255; a piece outside that vocabulary is written as its
  UTF-8 bytes, ids 0-255. Why not bytes alone: bytes would use 256 of the 50,257 ids, so
  the embedding, the softcapped output over the vocabulary, the bigram-hash embeddings and
  the per-token statistics would see a distribution nothing like the records'; a
  frequency-ranked vocabulary over ~50K ids gives the Zipf-shaped id distribution and
  about one token per word, like GPT-2 on English text. Nothing in the scripts depends on
  which id means which word; they depend on BOS = 50256 and ids < 50257;
- validation: separate files (those whose path hashes to 0 mod 10), in `val_000000.bin`;
- files: the training stream is cut at document starts into `train_files` files (default 2),
  `train_000000.bin`, `train_000001.bin`, ...: the records from 2026-01 on load the next
  shard in a background thread as they open the first (`next(file_iter)` twice before the
  first step), so a single training file ends their generator before step 0.

`check_shards(dir)` validates any folder of shards in this format (yours: real FineWeb
shards work unchanged) and says what it found; a wrong magic, version or token count is a
`ShardError` with the file named.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import sysconfig
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field


class ShardFormat(BaseModel):
    """The format facts every shard must satisfy."""

    magic: int = Field(20240520, description="header int32 #0")
    version: int = Field(1, description="header int32 #1")
    header_ints: int = Field(256, description="header length in int32 (1024 bytes); #2 is the token count")
    token_dtype: str = Field("<u2", description="tokens: little-endian uint16")
    bos_id: int = Field(50256, description="GPT-2 <|endoftext|>: the first token of every document")
    vocab_size: int = Field(50257, description="GPT-2 ids: every token is below this")


FORMAT = ShardFormat()
HEADER_BYTES = 4 * FORMAT.header_ints
BYTE_IDS = 256  # ids 0-255: raw UTF-8 bytes (the fallback for pieces outside the vocabulary)
FIRST_WORD_ID = BYTE_IDS
MAX_WORDS = FORMAT.bos_id - FIRST_WORD_ID  # word ids 256..50255
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
SCHEME = "stdlib-words-v1"
# GPT-2-style pieces: a contraction, a word with its leading space, a number, punctuation, whitespace
PIECE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d]\w*| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")
TOP_LEVEL = re.compile(r"^(?=\S)", re.M)  # a line that starts a top-level statement


class ShardError(ValueError):
    """A file is not a token shard in the records' format; the message names it."""


class ShardHeader(BaseModel):
    magic: int
    version: int
    num_tokens: int


class ShardInfo(BaseModel):
    """One shard file as `check_shards` found it."""

    path: str
    num_tokens: int
    documents: int = Field(..., description="BOS tokens in the shard")
    starts_with_bos: bool
    max_id: int
    doc_tokens_min: int | None = Field(None, description="shortest document, BOS to next BOS (None: < 2 BOS)")
    doc_tokens_median: float | None = None
    doc_tokens_max: int | None = None


class ShardSet(BaseModel):
    """A folder of shards, checked."""

    dir: str
    train: list[ShardInfo]
    val: list[ShardInfo]
    format: ShardFormat = FORMAT
    notes: list[str] = Field(default_factory=list, description="what a run should know (no BOS: BOS-aligned "
                                                                "records cannot find batches ...)")

    @property
    def train_tokens(self) -> int:
        return sum(s.num_tokens for s in self.train)

    @property
    def val_tokens(self) -> int:
        return sum(s.num_tokens for s in self.val)


class ShardSetMeta(BaseModel):
    """shards.json beside shards we made: how, from what, and the vocabulary (id 256 + i)."""

    scheme: str = SCHEME
    format: ShardFormat = FORMAT
    source: str = Field(..., description="the standard library folder the text came from")
    python: str = Field(..., description="the Python version whose standard library it is")
    train_tokens: int
    val_tokens: int
    max_doc_tokens: int
    train_files: int = Field(1, description="how many train_*.bin files the training stream was cut into")
    documents: dict[str, int] = Field(default_factory=dict, description="split -> documents")
    words: list[str] = Field(default_factory=list, description="the piece of word id 256 + i")


# -- reading and writing ------------------------------------------------------------------

def shard_bytes(tokens: np.ndarray) -> bytes:
    """A whole shard file's content for these token ids."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2 ** 16):
        raise ShardError("token ids must fit in uint16 (0-65535)")
    header = np.zeros(FORMAT.header_ints, dtype="<i4")
    header[:3] = (FORMAT.magic, FORMAT.version, tokens.size)
    return header.tobytes() + tokens.astype(FORMAT.token_dtype).tobytes()


def write_shard(path: Path, tokens: np.ndarray) -> bool:
    """Write a shard atomically; False (nothing written) when the file already holds exactly this."""
    content, path = shard_bytes(tokens), Path(path)
    if path.is_file() and path.stat().st_size == len(content) and path.read_bytes() == content:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return True


def read_header(path: Path) -> ShardHeader:
    """The header, checked: magic, version, and a file size that matches the token count."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=FORMAT.header_ints)
    magic, version, count = (int(x) for x in header[:3])
    if magic != FORMAT.magic:
        raise ShardError(f"{path}: magic number {magic}, expected {FORMAT.magic}: not a Modded-NanoGPT token "
                         f"shard (256 int32 header, then uint16 tokens)")
    if version != FORMAT.version:
        raise ShardError(f"{path}: format version {version}, only version {FORMAT.version} is known")
    if count < 0 or size != HEADER_BYTES + 2 * count:
        raise ShardError(f"{path}: the header says {count} tokens, the file holds "
                         f"{(size - HEADER_BYTES) / 2:g} (size {size} bytes)")
    return ShardHeader(magic=magic, version=version, num_tokens=count)


def read_shard(path: Path) -> np.ndarray:
    """The tokens of a checked shard (a read-only memory map: FineWeb shards are 200 MB)."""
    header = read_header(path)
    return np.memmap(path, dtype=FORMAT.token_dtype, mode="r", offset=HEADER_BYTES, shape=(header.num_tokens,))


def shard_info(path: Path) -> ShardInfo:
    tokens = read_shard(path)
    bos = np.flatnonzero(tokens == FORMAT.bos_id)
    lengths = np.diff(bos)
    return ShardInfo(path=str(path), num_tokens=int(tokens.size), documents=int(bos.size),
                     starts_with_bos=bool(tokens.size and tokens[0] == FORMAT.bos_id),
                     max_id=int(tokens.max()) if tokens.size else -1,
                     doc_tokens_min=int(lengths.min()) if lengths.size else None,
                     doc_tokens_median=float(np.median(lengths)) if lengths.size else None,
                     doc_tokens_max=int(lengths.max()) if lengths.size else None)


def check_shards(dir: Path) -> ShardSet:
    """Every `train_*.bin` / `val_*.bin` in a folder, validated; ShardError on the first bad one."""
    dir = Path(dir)
    if not dir.is_dir():
        raise ShardError(f"{dir}: no such folder")
    train, val = sorted(dir.glob("train_*.bin")), sorted(dir.glob("val_*.bin"))
    if not train or not val:
        missing = " and ".join(n for n, found in (("train_*.bin", train), ("val_*.bin", val)) if not found)
        raise ShardError(f"{dir}: no {missing} (the records read train_*.bin and val_*.bin)")
    out = ShardSet(dir=str(dir), train=[shard_info(p) for p in train], val=[shard_info(p) for p in val])
    for s in out.train + out.val:
        if s.max_id >= FORMAT.vocab_size:
            raise ShardError(f"{s.path}: token id {s.max_id} >= {FORMAT.vocab_size}: not GPT-2 token ids")
        if s.documents == 0:
            out.notes.append(f"{s.path}: no BOS ({FORMAT.bos_id}) at all: records from 26 on align batches to "
                             f"BOS and will find none")
        elif not s.starts_with_bos:
            out.notes.append(f"{s.path}: does not start with BOS (its first document is partial)")
    return out


# -- a BOS-aligned batch finder (what the records from 26 on do, written for our tests) -----

def bos_positions(tokens: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.asarray(tokens) == FORMAT.bos_id)


def bos_batch(tokens: np.ndarray, start: int, num_tokens: int, *, max_doc_tokens: int | None = None,
              bos: np.ndarray | None = None) -> tuple[list[tuple[int, int]], int]:
    """Document segments from the first BOS at or after `start` that hold `num_tokens` + 1 tokens.

    Returns ([(begin, end), ...], the position after the batch). Each segment starts at a
    BOS; a document longer than `max_doc_tokens` contributes only its first
    `max_doc_tokens` tokens (the records' `train_max_seq_len`); the last segment is cut
    where the batch is full. StopIteration when the shard has too few documents left.
    """
    bos = bos_positions(tokens) if bos is None else bos
    i = int(np.searchsorted(bos, start))
    segments, have, n = [], 0, len(tokens)
    while have < num_tokens + 1:
        if i >= len(bos):
            raise StopIteration("not enough documents (BOS) left in the shard")
        begin = int(bos[i])
        end = int(bos[i + 1]) if i + 1 < len(bos) else n
        if max_doc_tokens:
            end = min(end, begin + max_doc_tokens)
        end = min(end, begin + num_tokens + 1 - have)
        segments.append((begin, end))
        have += end - begin
        i += 1
    return segments, segments[-1][1]


# -- making shards from the standard library ------------------------------------------------

def _stdlib_files(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _is_val(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % 10 == 0


def _split_blocks(text: str) -> list[str]:
    """Top-level statements (a `def` with its body, an import, a comment block ...)."""
    cuts = [m.start() for m in TOP_LEVEL.finditer(text)] or [0]
    if cuts[0] != 0:
        cuts.insert(0, 0)
    return [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)]) if text[a:b]]


class WordIds:
    """The deterministic word-level id assignment (see the module docstring)."""

    def __init__(self, words: list[str]):
        self.words = words
        self.ids = {w: FIRST_WORD_ID + i for i, w in enumerate(words)}

    @classmethod
    def from_counts(cls, counts: Counter) -> "WordIds":
        ranked = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: (-counts[w], w))
        return cls(ranked[:MAX_WORDS])

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for piece in PIECE.findall(text):
            wid = self.ids.get(piece)
            if wid is None:
                out.extend(piece.encode("utf-8"))
            else:
                out.append(wid)
        return out

    def decode(self, ids) -> str:
        data = bytearray()
        for t in ids:
            t = int(t)
            if t == FORMAT.bos_id:
                continue
            data += bytes([t]) if t < BYTE_IDS else self.words[t - FIRST_WORD_ID].encode("utf-8")
        return data.decode("utf-8", errors="replace")


def _documents(text: str, words: WordIds, max_doc_tokens: int, min_doc_tokens: int) -> list[list[int]]:
    """One source file as documents of at most `max_doc_tokens` tokens, each starting with BOS."""
    docs: list[list[int]] = []
    cur: list[int] = []
    limit = max_doc_tokens - 1  # room for the BOS
    for block in _split_blocks(text):
        ids = words.encode(block)
        if cur and len(cur) + len(ids) > limit:
            docs.append(cur)
            cur = []
        while len(ids) > limit:  # one statement longer than a document: cut it
            docs.append(ids[:limit])
            ids = ids[limit:]
        cur += ids
    if cur:
        docs.append(cur)
    return [[FORMAT.bos_id, *d] for d in docs if len(d) >= min_doc_tokens]


def make_record_shards(out_dir: Path, *, train_tokens: int, val_tokens: int, max_doc_tokens: int = 384,
                       min_doc_tokens: int = 16, source_root: Path | None = None, seed: int = 0,
                       train_files: int = 2) -> Path:
    """`train_000000.bin`.. (`train_files` of them) / `val_000000.bin` (+ shards.json) in out_dir; the folder.

    Deterministic for one Python installation; shards that already match are left alone.
    """
    if train_tokens < 1 or val_tokens < 1 or max_doc_tokens < 2 * min_doc_tokens:
        raise ValueError("train_tokens and val_tokens must be positive, max_doc_tokens >= 2 x min_doc_tokens")
    if not 1 <= train_files <= train_tokens // (2 * max_doc_tokens):
        raise ValueError(f"train_files must be 1..{train_tokens // (2 * max_doc_tokens)} "
                         f"(each file holds at least two documents)")
    out_dir = Path(out_dir)
    root = Path(source_root) if source_root else Path(sysconfig.get_paths()["stdlib"])
    meta_path = out_dir / "shards.json"
    wanted = dict(scheme=SCHEME, source=str(root), python=sys.version.split()[0], train_tokens=train_tokens,
                  val_tokens=val_tokens, max_doc_tokens=max_doc_tokens, train_files=train_files)
    if meta_path.is_file():  # made before with the same recipe: check, don't remake
        try:
            old = ShardSetMeta.model_validate_json(meta_path.read_text())
            if all(getattr(old, k) == v for k, v in wanted.items()):
                found = check_shards(out_dir)
                if (found.train_tokens, found.val_tokens, len(found.train)) == (train_tokens, val_tokens,
                                                                                train_files):
                    return out_dir
        except (ValueError, ShardError):
            pass
    texts = {"train": [], "val": []}
    pieces = {"train": 0, "val": 0}
    need = {"train": train_tokens, "val": val_tokens}
    counts: Counter = Counter()
    for path in _stdlib_files(root):
        if all(pieces[s] >= 1.1 * need[s] for s in need):  # 10% spare: short documents are dropped
            break
        rel = path.relative_to(root).as_posix()
        split = "val" if _is_val(rel) else "train"
        if pieces[split] >= 1.1 * need[split]:  # that split is full: the file goes to the other one
            split = "train" if split == "val" else "val"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = PIECE.findall(text)
        counts.update(found)
        texts[split].append(text)
        pieces[split] += len(found)
    if any(pieces[s] < need[s] for s in need):
        raise ShardError(f"only {pieces['train']:,} + {pieces['val']:,} word pieces of .py source under {root}; "
                         f"asked for {train_tokens:,} train + {val_tokens:,} val tokens")
    words = WordIds.from_counts(counts)
    out_dir.mkdir(parents=True, exist_ok=True)
    documents: dict[str, int] = {}
    for split in ("train", "val"):
        docs = [d for text in texts[split] for d in _documents(text, words, max_doc_tokens, min_doc_tokens)]
        random.Random(f"{seed}-{split}").shuffle(docs)
        stream = np.fromiter((t for d in docs for t in d), dtype=np.int64)
        if stream.size < need[split]:
            raise ShardError(f"{split}: {stream.size:,} tokens after cutting documents, asked for {need[split]:,}")
        tokens = stream[: need[split]]
        documents[split] = int((tokens == FORMAT.bos_id).sum())
        for old in out_dir.glob(f"{split}_*.bin"):
            old.unlink()
        for i, part in enumerate(_cut_at_documents(tokens, train_files if split == "train" else 1)):
            write_shard(out_dir / f"{split}_{i:06d}.bin", part)
    meta = ShardSetMeta(**wanted, documents=documents, words=words.words)
    meta_path.write_text(json.dumps(meta.model_dump(), indent=0))
    return out_dir


def _cut_at_documents(tokens: np.ndarray, parts: int) -> list[np.ndarray]:
    """`parts` consecutive pieces of about equal length, each starting at a BOS."""
    bos = bos_positions(tokens)
    cuts = sorted({int(bos[np.abs(bos - len(tokens) * k // parts).argmin()]) for k in range(1, parts)})
    return np.split(tokens, cuts)


def load_words(out_dir: Path) -> WordIds:
    """The word ids of shards made by make_record_shards (to decode them)."""
    meta = ShardSetMeta.model_validate_json((Path(out_dir) / "shards.json").read_text())
    return WordIds(meta.words)
