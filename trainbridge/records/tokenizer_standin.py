"""A local `tiktoken` for records that read the tokenizer, over the vocabulary of our shards.

Record 88 builds a table from `tiktoken.get_encoding("gpt2")._mergeable_ranks`: each token's
longest proper byte prefix that is itself a token. The real call downloads GPT-2's BPE file
at run time (nothing may download here), and its ids would not be the ids of our shards
anyway: we write word-level ids (`shards.py`). So a record workload made on our shards gets a
`tiktoken.py` beside its script that answers for the shards' own vocabulary: byte `b` is
id `b`, word `i` of `shards.json` is id 256 + i, BOS is 50256. Tables the record derives from
the tokenizer then describe the tokens the record really reads. With `--shards DIR` (real
GPT-2 shards) no stand-in is written and the user's tiktoken answers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MODULE_NAME = "tiktoken.py"
_IMPORTS = re.compile(r"^\s*(?:import\s+tiktoken\b|from\s+tiktoken\b)", re.M)

_TEMPLATE = '''"""tiktoken stand-in written by `trainbridge records run`: the vocabulary of the shards in
data/ (word-level ids: byte b is id b, word i is id 256 + i, BOS 50256), not GPT-2's BPE.
The real module would download GPT-2's merges and describe other ids than the shards hold."""

import re

_WORDS = __WORDS__
_PIECE = re.compile(__PIECE__)
_BOS = 50256


class Encoding:
    def __init__(self, name):
        self.name = name
        ranks = {bytes([b]): b for b in range(256)}
        for i, w in enumerate(_WORDS):
            ranks.setdefault(w.encode("utf-8"), 256 + i)
        self._mergeable_ranks = ranks
        self._ids = {w: 256 + i for i, w in enumerate(_WORDS)}
        self.n_vocab = _BOS + 1
        self.eot_token = _BOS
        self.max_token_value = _BOS

    def encode_ordinary(self, text):
        out = []
        for piece in _PIECE.findall(text):
            wid = self._ids.get(piece)
            out.extend(piece.encode("utf-8") if wid is None else [wid])
        return out

    def encode(self, text, allowed_special=(), disallowed_special=()):
        return self.encode_ordinary(text)

    def decode_bytes(self, ids):
        data = bytearray()
        for t in ids:
            t = int(t)
            if t != _BOS:
                data += bytes([t]) if t < 256 else _WORDS[t - 256].encode("utf-8")
        return bytes(data)

    def decode(self, ids, errors="replace"):
        return self.decode_bytes(ids).decode("utf-8", errors=errors)


def get_encoding(name):
    return Encoding(name)


def encoding_for_model(name):
    return Encoding(name)
'''


def imports_tiktoken(texts: list[str]) -> bool:
    return any(_IMPORTS.search(t) for t in texts)


def standin_source(words: list[str], piece_pattern: str) -> str:
    return (_TEMPLATE.replace("__WORDS__", json.dumps(words, ensure_ascii=True))
            .replace("__PIECE__", repr(piece_pattern)))


def write_standin(dest: Path, shards: Path, texts: list[str]) -> str | None:
    """Write `tiktoken.py` into `dest` when the record imports tiktoken and reads our shards;
    returns a note for the record's row, or None when nothing was written."""
    from .shards import PIECE, ShardSetMeta

    meta_path = Path(shards) / "shards.json"
    if not imports_tiktoken(texts) or not meta_path.is_file():
        return None
    meta = ShardSetMeta.model_validate_json(meta_path.read_text())
    (dest / MODULE_NAME).write_text(standin_source(meta.words, PIECE.pattern))
    return (f"tiktoken answered by a local stand-in over the shards' vocabulary ({len(meta.words)} words + "
            f"256 bytes, BOS 50256): the real gpt2 encoding downloads at run time and describes other ids")
