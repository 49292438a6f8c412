"""Talking to an OpenAI-compatible chat endpoint: retries, backoff, the transcript, the key kept out.

Transport failures (time-outs, 429 with Retry-After, 5xx, connection errors) and garbage
answers (not JSON, not the schema) are retried with exponential backoff up to `max_retries`,
then `GiveUp` carries the last error. A server that refuses `response_format` (HTTP 400/422)
is asked again for plain JSON text. Every request and answer is kept in `transcript`, with the
tokens, cost and latency the server reports; the API key never is (it is also redacted from
any text a server echoes back).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from .answer import RESPONSE_FORMAT, AnswerError, LLMAnswer, parse_answer

log = logging.getLogger(__name__)

DUMMY_KEY = "sk-no-key-needed"  # local servers accept any key; the client insists on one

Outcome = Literal["pending", "answer", "applied", "declined_by_model", "apply_failed", "recipe_failed",
                  "guard_failed", "invalid_answer", "timeout", "rate_limited", "server_error",
                  "connection_error", "http_error", "error"]


class LLMExchange(BaseModel):
    """One request to the endpoint and what came back (never the API key)."""

    kind: Literal["propose", "repair"]
    attempt: int
    time_utc: str
    model: str = Field(..., description="model requested")
    response_model: str | None = Field(None, description="model the server says answered")
    base_url: str | None = None
    plan_key: str | None = None
    request_messages: list[dict[str, str]]
    response_format: str = Field(..., description="json_schema | none")
    raw_answer: str | None = None
    http_status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cost: float | None = Field(None, description="as the server reports it in usage, if it does")
    latency_ms: float = 0.0
    outcome: Outcome = "pending"
    error: str | None = None


class GiveUp(Exception):
    """No usable answer within the retries (or an HTTP error that retrying cannot fix)."""


class ChatClient:
    """One model at one endpoint; `ask` returns the first answer that parses."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = 60, max_retries: int = 4, client=None, temperature: float | None = 0.0,
                 max_tokens: int | None = None, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 sleep=time.sleep):
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.__key = api_key or os.environ.get("OPENAI_API_KEY") or DUMMY_KEY
        self.max_retries = max_retries
        self.timeout_s = float(timeout_s)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._sleep = sleep
        self.use_schema = True
        self.transcript: list[LLMExchange] = []
        if client is None:
            import openai

            # openai.Timeout is the timeout class of the HTTP library this openai release is
            # built on (httpx in 1.x, httpx2 in 3.x): another library's class is refused.
            client = openai.OpenAI(api_key=self.__key, base_url=self.base_url, max_retries=0,
                                   timeout=openai.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)))
        elif hasattr(client, "with_options"):
            client = client.with_options(max_retries=0)
        self._openai = client

    def __repr__(self) -> str:
        return f"ChatClient(model={self.model!r}, base_url={self.base_url!r})"

    def redact(self, text):
        key = self.__key
        if isinstance(text, str) and key and key != DUMMY_KEY and len(key) >= 4:
            return text.replace(key, "[redacted]")
        return text

    def transcript_json(self) -> str:
        return self.redact(json.dumps([x.model_dump() for x in self.transcript], indent=1))

    def ask(self, messages: list[dict], kind: str, item) -> tuple[LLMAnswer, LLMExchange]:
        """One answer that parses, after up to max_retries retries; GiveUp with the last error otherwise."""
        import openai

        convo = list(messages)
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            ex = LLMExchange(kind=kind, attempt=attempt, time_utc=dt.datetime.now(dt.UTC).isoformat(),
                             model=self.model, base_url=self.base_url, plan_key=getattr(item, "key", None),
                             request_messages=[{"role": m["role"], "content": self.redact(m["content"])} for m in convo],
                             response_format="json_schema" if self.use_schema else "none")
            self.transcript.append(ex)
            kwargs: dict[str, Any] = {"model": self.model, "messages": convo, "timeout": self.timeout_s}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.max_tokens:
                kwargs["max_tokens"] = self.max_tokens
            if self.use_schema:
                kwargs["response_format"] = RESPONSE_FORMAT
            delay = self._backoff(attempt)
            t0 = time.monotonic()
            try:
                resp = self._openai.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                ex.outcome, last = "timeout", f"time-out: no answer within {self.timeout_s:g} s"
            except openai.RateLimitError as e:
                ex.outcome, ex.http_status = "rate_limited", 429
                wait = self._retry_after(e)
                last = "rate limited (HTTP 429)" + (f", Retry-After {wait:g} s" if wait is not None else "")
                delay = min(self.max_backoff_s, wait) if wait is not None else delay
            except openai.APIStatusError as e:
                ex.http_status = e.status_code
                last = f"HTTP {e.status_code}: {self._short(e)}"
                if e.status_code >= 500 or e.status_code in (408, 409):
                    ex.outcome = "server_error"
                elif e.status_code in (400, 422) and self.use_schema:
                    # The server may not know response_format=json_schema: ask for plain JSON text instead.
                    ex.outcome, self.use_schema, delay = "http_error", False, 0.0
                    last += " (retrying without response_format)"
                else:
                    ex.outcome, ex.error = "http_error", self.redact(last)
                    ex.latency_ms = 1000 * (time.monotonic() - t0)
                    raise GiveUp(self.redact(last)) from None
            except openai.APIConnectionError as e:
                ex.outcome, last = "connection_error", f"connection error: {self._short(e)}"
            except Exception as e:  # anything the client raises on a broken response
                ex.outcome, last = "error", f"{type(e).__name__}: {self._short(e)}"
            else:
                ex.latency_ms = 1000 * (time.monotonic() - t0)
                raw, err = self._read(resp, ex)
                ex.raw_answer = self.redact(raw)
                if err is None:
                    try:
                        answer = parse_answer(raw)
                    except AnswerError as e:
                        err = str(e)
                    else:
                        ex.outcome = "answer"
                        log.info("llm %s %s attempt %d: answer (%s tokens in, %s out, %.0f ms)", self.model, kind,
                                 attempt, ex.prompt_tokens, ex.completion_tokens, ex.latency_ms)
                        return answer, ex
                ex.outcome, last = "invalid_answer", f"invalid answer: {err}"
                # show the model what was wrong with its answer on the next attempt
                convo = list(messages) + [
                    {"role": "assistant", "content": (raw or "")[:4000]},
                    {"role": "user", "content": f"That answer could not be used: {err}. Answer again with exactly "
                                                "one JSON object of the requested schema, and nothing else."}]
            if not ex.latency_ms:
                ex.latency_ms = 1000 * (time.monotonic() - t0)
            ex.error = self.redact(last)
            log.warning("llm %s %s attempt %d/%d failed: %s", self.model, kind, attempt + 1, self.max_retries + 1,
                        ex.error)
            if attempt < self.max_retries and delay > 0:
                self._sleep(delay)
        raise GiveUp(self.redact(f"gave up after {self.max_retries + 1} attempt(s); last error: {last}"))

    def _read(self, resp, ex: LLMExchange) -> tuple[str | None, str | None]:
        """(answer text, error) from a chat.completion, recording model, usage and cost."""
        if isinstance(resp, (str, bytes)):
            text = resp.decode(errors="replace") if isinstance(resp, bytes) else resp
            return text, "the server's response is not a chat.completion JSON object"
        try:
            ex.response_model = getattr(resp, "model", None)
            usage = getattr(resp, "usage", None)
            if usage is not None:
                ex.prompt_tokens = getattr(usage, "prompt_tokens", None)
                ex.completion_tokens = getattr(usage, "completion_tokens", None)
                ex.total_tokens = getattr(usage, "total_tokens", None)
                extra = getattr(usage, "model_extra", None) or {}
                cost = getattr(usage, "cost", None) or extra.get("cost") or extra.get("total_cost")
                if isinstance(cost, (int, float)):
                    ex.cost = float(cost)
            choice = resp.choices[0]
            content = choice.message.content
        except Exception as e:
            return None, f"malformed chat.completion ({type(e).__name__}: {e})"
        if not content:
            reason = getattr(choice, "finish_reason", None)
            return content, f"empty message content (finish_reason={reason})"
        return content, None

    def _retry_after(self, e) -> float | None:
        headers = getattr(getattr(e, "response", None), "headers", None) or {}
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            v = headers.get(name)
            if v is None:
                continue
            try:
                return max(0.0, float(v) * scale)
            except ValueError:
                try:
                    from email.utils import parsedate_to_datetime

                    when = parsedate_to_datetime(v)
                    return max(0.0, (when - dt.datetime.now(when.tzinfo)).total_seconds())
                except Exception:
                    continue
        return None

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * (2 ** attempt)) * (1 + 0.1 * random.random())

    def _short(self, e: Exception) -> str:
        return self.redact(" ".join(str(e).split())[:300])
