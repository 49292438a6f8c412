"""The language-model rewriter: ask, turn the answer into a candidate, send failures back.

`LLMRewriter` ties the parts together: `PromptWriter` builds the request, `ChatClient` gets
an answer that parses, `realise` applies it. Answers that do not apply (an edit that does not
match, a recipe that finds no site, a guard violation when the context carries the manifest)
go back to the model with the exact failure, up to `max_repairs` times; the loop calls
`repair()` the same way after validation or measurement failed. `WithFallback` puts the
recipe library behind it for when the model declines or the endpoint fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

from ....measure.acceptance import MAX_ANSWER_REPAIRS
from ..base import Declined, Proposal
from .answer import LLMAnswer
from .client import ChatClient, GiveUp, LLMExchange
from .messages import PromptWriter
from .realise import RealiseFailure, realise

log = logging.getLogger(__name__)


class LLMRewriter:
    """Rewriter through an OpenAI-compatible chat endpoint (see the module docstring)."""

    can_repair = True

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 max_repairs: int = MAX_ANSWER_REPAIRS, timeout_s: float = 60, max_retries: int = 4, client=None,
                 temperature: float | None = 0.0, max_tokens: int | None = None,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 whole_file_lines: int = 400, window_margin: int = 25, sleep=time.sleep):
        if not model:
            raise ValueError("LLMRewriter needs a model name (--model)")
        self.model = model
        self.max_repairs = max_repairs
        self.chat = ChatClient(model, base_url, api_key, timeout_s=timeout_s, max_retries=max_retries, client=client,
                               temperature=temperature, max_tokens=max_tokens, backoff_s=backoff_s,
                               max_backoff_s=max_backoff_s, sleep=sleep)
        self.prompts = PromptWriter(whole_file_lines=whole_file_lines, window_margin=window_margin)
        self._answers: dict[str, LLMAnswer] = {}

    @property
    def base_url(self) -> str | None:
        return self.chat.base_url

    @property
    def transcript(self) -> list[LLMExchange]:
        return self.chat.transcript

    def __repr__(self) -> str:
        return f"LLMRewriter(model={self.model!r}, base_url={self.base_url!r})"

    def transcript_json(self) -> str:
        return self.chat.transcript_json()

    # ------------------------------------------------------------- public ----
    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined:
        context = context or {}
        try:
            messages = self.prompts.base_messages(item, files, target, context)
        except Exception as e:
            return Declined(reason=f"llm:{self.model}: could not build the prompt: {type(e).__name__}: {e}")
        return self._run(item, files, files, target, context, messages, "propose")

    def repair(self, item, files: dict[str, str], target: str, context: dict, previous: Proposal,
               failure: str) -> Proposal | Declined:
        """Ask again with the exact failure of `previous`; new edits apply to previous.files."""
        context = context or {}
        try:
            messages = self.prompts.base_messages(item, files, target, context)
            prev_answer = self._answers.get(self._files_key(previous.files))
            messages = messages + self.prompts.repair_turn(
                prev_answer, previous_text=self.prompts.previous_text(prev_answer, files, previous),
                failure=failure, stage="the candidate was built, then validation or measurement rejected it",
                base=previous.files, base_note=("The candidate program as your previous change left it. New edits "
                                                "apply to this source; a recipe applies to the incumbent program."),
                item=item, target=target, context=context)
        except Exception as e:
            return Declined(reason=f"llm:{self.model}: could not build the repair prompt: {type(e).__name__}: {e}")
        return self._run(item, files, previous.files, target, context, messages, "repair")

    # --------------------------------------------------------------- flow ----
    def _run(self, item, incumbent, base, target, context, messages, kind):
        """Ask, realise the answer, and send failures back (max_repairs times) with the exact message."""
        repairs_left = self.max_repairs
        first_messages = messages[:2]  # system + rewrite prompt: every repair turn follows these
        while True:
            try:
                answer, ex = self.chat.ask(messages, kind, item)
            except GiveUp as g:
                return Declined(reason=f"llm:{self.model}: {g}")
            try:
                result = realise(answer, item, incumbent, base, target, context, self.model)
            except RealiseFailure as f:
                ex.outcome = f"{f.stage}_failed" if f.stage in ("apply", "recipe", "guard") else "error"
                ex.error = self.chat.redact(f.message)
                log.info("llm %s answer did not apply (%s): %s", self.model, f.stage, self.chat.redact(f.message))
                if repairs_left <= 0:
                    return Declined(reason=f"llm:{self.model}: {f.stage} failed after {self.max_repairs} "
                                           f"repair(s): {f.message}")
                repairs_left -= 1
                stage = {"apply": "its edits could not be applied", "recipe": "the recipe could not be applied",
                         "guard": "the static guard rejected the candidate"}.get(f.stage, f.stage)
                same = "New edits apply to the same source as before:" if base is incumbent else (
                    "New edits apply to the candidate program below (a recipe applies to the incumbent):")
                messages = first_messages + self.prompts.repair_turn(
                    answer, previous_text=answer.model_dump_json(indent=1), failure=f.message, stage=stage,
                    base=base, base_note=same, item=item, target=target, context=context)
                kind = "repair"
                continue
            if isinstance(result, Declined):
                ex.outcome = "declined_by_model"
                return result
            ex.outcome = "applied"
            self._answers[self._files_key(result.files)] = answer
            return result

    @staticmethod
    def _files_key(files: dict[str, str]) -> str:
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()

    def _rewrite_prompt(self, item, files, target, context) -> str:
        """The rewrite request of a first proposal, as the model would get it."""
        return self.prompts.rewrite_prompt(item, files, target, context)


class WithFallback:
    """The primary rewriter, and the fallback (the recipes) when it declines or raises."""

    def __init__(self, primary, fallback):
        self.primary, self.fallback = primary, fallback

    @property
    def can_repair(self) -> bool:
        return bool(getattr(self.primary, "can_repair", False))

    @property
    def transcript(self) -> list:
        return getattr(self.primary, "transcript", [])

    def transcript_json(self) -> str:
        fn = getattr(self.primary, "transcript_json", None)
        return fn() if fn else "[]"

    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined:
        try:
            first = self.primary.propose(item, files, target, context)
        except Exception as e:
            log.warning("primary rewriter raised %s: %s", type(e).__name__, e)
            first = Declined(reason=f"primary rewriter raised {type(e).__name__}: {e}")
        if isinstance(first, Proposal):
            return first
        try:
            second = self.fallback.propose(item, files, target, context)
        except Exception as e:
            second = Declined(reason=f"fallback raised {type(e).__name__}: {e}")
        if isinstance(second, Proposal):
            return second.model_copy(update={"notes": [*second.notes, f"fallback after the primary declined: "
                                                                      f"{first.reason}"]})
        return Declined(reason=f"primary: {first.reason}; fallback: {second.reason}")

    def repair(self, item, files: dict[str, str], target: str, context: dict, previous: Proposal,
               failure: str) -> Proposal | Declined:
        fn = getattr(self.primary, "repair", None)
        if fn is None:
            return Declined(reason="the primary rewriter cannot repair")
        try:
            return fn(item, files, target, context, previous, failure)
        except Exception as e:
            return Declined(reason=f"primary rewriter raised {type(e).__name__} in repair: {e}")
