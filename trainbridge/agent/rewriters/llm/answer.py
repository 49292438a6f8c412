"""What the model must answer, and reading it out of whatever text came back.

The model answers one JSON object: a library recipe by name, or search-and-replace edits,
with the intent it addresses, its level and its own hypothesis. `ANSWER_SCHEMA` is sent as
`response_format` where the server supports it; `parse_answer` also accepts the object in a
```json fence or embedded in prose, because many servers and models add either. An answer
that is not such an object raises `AnswerError`, whose message goes back to the model.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..edits import Edit

LEVELS = ("L0", "L1", "L2", "L3", "L4", "L5", "L6")


class LLMHypothesis(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ops_removed: list[str] = Field(default_factory=list)
    predicted_saving_pct: float = 0.0
    reject_if: str = ""


class LLMAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    intent_addressed: str
    mechanism: str = ""
    level: str
    hypothesis: LLMHypothesis
    recipe: str | None = Field(None, description="a library recipe by name, instead of edits")
    edits: list[Edit] = Field(default_factory=list)

    @field_validator("level", mode="before")
    @classmethod
    def _level(cls, v):
        m = re.search(r"\bL\s*([0-6])\b", str(v), re.IGNORECASE)
        if not m:
            raise ValueError(f"level {v!r} is not one of {', '.join(LEVELS)}")
        return f"L{m.group(1)}"

    @field_validator("recipe", mode="before")
    @classmethod
    def _recipe(cls, v):
        if isinstance(v, str) and v.strip().lower() in ("", "null", "none"):
            return None
        return v.strip() if isinstance(v, str) else v


_STR = {"type": "string"}
ANSWER_SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["intent_addressed", "mechanism", "level", "hypothesis", "recipe", "edits"],
    "properties": {
        "intent_addressed": _STR,
        "mechanism": _STR,
        "level": {"type": "string", "enum": list(LEVELS)},
        "hypothesis": {
            "type": "object",
            "additionalProperties": False,
            "required": ["ops_removed", "predicted_saving_pct", "reject_if"],
            "properties": {"ops_removed": {"type": "array", "items": _STR},
                           "predicted_saving_pct": {"type": "number"}, "reject_if": _STR},
        },
        "recipe": {"type": ["string", "null"]},
        "edits": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": False, "required": ["file", "search", "replace"],
                      "properties": {"file": _STR, "search": _STR, "replace": _STR}},
        },
    },
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "trainbridge_rewrite", "strict": True,
                                                          "schema": ANSWER_SCHEMA}}


class AnswerError(ValueError):
    """An answer that is not one JSON object of the LLMAnswer schema."""


def _json_candidates(text: str):
    yield text.strip()
    for m in re.finditer(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", text, re.DOTALL):
        yield m.group(1).strip()
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def parse_answer(text: str | None) -> LLMAnswer:
    """The LLMAnswer in text: the whole text, a ```json fence, or the first JSON object in it."""
    if not text or not text.strip():
        raise AnswerError("empty answer")
    schema_errors: list[str] = []
    seen_object = False
    for cand in _json_candidates(text):
        if isinstance(cand, str):
            try:
                cand = json.loads(cand)
            except json.JSONDecodeError:
                continue
        if not isinstance(cand, dict):
            continue
        seen_object = True
        try:
            return LLMAnswer.model_validate(cand)
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}" for x in e.errors()[:5])
            schema_errors.append(errs)
    if seen_object:
        raise AnswerError(f"JSON does not match the answer schema: {schema_errors[0]}")
    raise AnswerError(f"no JSON object in the answer (begins {text.strip()[:80]!r})")
