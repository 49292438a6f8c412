"""The language-model rewriter: any OpenAI-compatible chat endpoint writes the candidate.

The model is shown the program around the intent's sites, the intent and its GPU
evidence, the target's profile, the target's operators (exact signatures and caveats),
the recipe library and what was tried before; it answers one JSON object (`LLMAnswer`):
either a library recipe by name, or search-and-replace edits (`edits.py`). Answers that do
not apply (an edit that does not match, a recipe that finds no site, a guard violation when
the context carries the manifest) go back to the model with the exact failure, up to
`max_repairs` times; the loop calls `repair()` the same way after validation or
measurement failed.

Transport failures (time-outs, 429 with Retry-After, 5xx, connection errors) and garbage
answers (not JSON, not the schema) are retried with exponential backoff up to
`max_retries`, then reported as `Declined` with the last error. Every request and answer is
kept in `self.transcript`; the API key never is (it is also redacted from any text a server
echoes back).
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import logging
import os
import random
import re
import string
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ...measure.acceptance import MAX_ANSWER_REPAIRS
from .base import Declined, Proposal
from .edits import Edit, EditError, apply_edits

log = logging.getLogger(__name__)

PROMPTS_ENV = "TRAINBRIDGE_PROMPTS"
DUMMY_KEY = "sk-no-key-needed"  # local servers accept any key; the client insists on one
LEVELS = ("L0", "L1", "L2", "L3", "L4", "L5", "L6")


# ------------------------------------------------------------------- prompts ----

def prompts_dir() -> Path:
    """$TRAINBRIDGE_PROMPTS, else prompts/ at the repository root, else ./prompts."""
    env = os.environ.get(PROMPTS_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"{PROMPTS_ENV}={env}: not a directory")
        return p
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "prompts"
        if (cand / "system.md").is_file():
            return cand
    cand = Path.cwd() / "prompts"
    if (cand / "system.md").is_file():
        return cand
    raise FileNotFoundError(f"no prompts/ folder with system.md above {here} or in {Path.cwd()}; set {PROMPTS_ENV}")


def load_prompt(name: str) -> str:
    """The text of prompts/<name> (".md" may be left off)."""
    d = prompts_dir()
    path = d / name
    if not path.is_file() and not name.endswith(".md"):
        path = d / f"{name}.md"
    if not path.is_file():
        raise FileNotFoundError(f"prompt {name!r} not found in {d}")
    return path.read_text()


def render_prompt(name: str, **values: Any) -> str:
    """prompts/<name> with its $placeholders filled (string.Template; a missing value is an error)."""
    return string.Template(load_prompt(name)).substitute({k: str(v) for k, v in values.items()})


# ------------------------------------------------------------- answer model ----

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


# ---------------------------------------------------------------- transcript ----

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


class _GiveUp(Exception):
    pass


class _Failure(Exception):
    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage, self.message = stage, message


# ------------------------------------------------------------- prompt parts ----

_BUILTIN_CATALOG = {
    "cpu": """\
- `torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)`: replaces
  `x * rsqrt(mean(x^2, -1, keepdim=True) + eps) [* w]`. eps=None means torch.finfo(dtype).eps,
  not the program's eps: pass eps explicitly. normalized_shape is a tuple, e.g. `(x.size(-1),)`.
- `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False)`: replaces matmul/scale/mask/softmax/matmul.
  Layout (B, heads, T, head_dim); default scale 1/sqrt(head_dim); a bool attn_mask is True where
  attention is ALLOWED; is_causal=True together with attn_mask is an error. Flash kernel on CPU.
- `torch.nn.functional.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05)`.
- `torch.nn.functional.silu / gelu(input, approximate='none'|'tanh') / relu`: fused activations.
- `torch.nn.functional.cross_entropy(input, target, weight=None, ignore_index=-100, reduction='mean',
  label_smoothing=0.0)`: fuses log_softmax + nll_loss; input [N, C].
- `torch.optim.AdamW(params, lr, betas, eps, weight_decay, foreach=None, fused=None)`: `fused=True`
  (CPU and CUDA, floating-point params) or `foreach=True` replace the per-parameter update loop.
- `torch.compile(fn, fullgraph=False, dynamic=None, mode=None)`: compile ONE region; the first
  steps pay compilation (warm-up steps absorb it); graph breaks show as extra ops.
- `torch.autocast(device_type="cpu", dtype=torch.bfloat16)`: bf16 matmuls on CPU (a precision change:
  only to restore what the GPU program did).
- `torch.addcmul / torch.addcdiv / torch.lerp / torch._foreach_*`: fused pointwise optimizer maths.""",
    "cuda": """\
- `torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)`: fused RMSNorm;
  pass the program's eps explicitly (None means machine epsilon of the dtype).
- `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False)`: flash / memory-efficient kernels; layout
  (B, heads, T, head_dim); bool mask True = attend; prefer is_causal=True over a tril mask.
- `torch.nn.functional.layer_norm / silu / gelu / cross_entropy`: fused kernels.
- `torch.optim.AdamW(..., fused=True)`: one multi-tensor kernel for the update.
- `torch.compile(fn, fullgraph=False, dynamic=None, mode=None)`: Inductor/Triton for ONE region.
- `torch.autocast(device_type="cuda", dtype=torch.bfloat16)`; `torch.backends.cuda.matmul.allow_tf32`
  is a precision change (only when the GPU program used it).""",
    "npu": """\
- `torch_npu.npu_rms_norm(input, gamma, epsilon=1e-6) -> (y, rstd)`: take `[0]`; gamma must exist
  (use ones when the program has no weight) and share the input's dtype; has backward.
- `torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, atten_mask=None,
  scale=1., keep_prob=1., sparse_mode=0, ...)`: returns 7 values, output `[0]`; scale defaults to 1
  (pass 1/sqrt(d)); bool atten_mask is True where MASKED OUT; causal via sparse_mode=2 or 3 with a
  2048x2048 upper-triangular mask; layouts BSH/SBH/BSND/BNSD/TND; head dim <= 768.
- `torch_npu.npu_rotary_mul(input, r1, r2, rotary_mode='half')`: 4-D input, even head dim < 896.
- `torch_npu.npu_swiglu(input, dim=-1)`: `silu(a) * b` for `a, b = x.chunk(2, dim)`; has backward.
- `torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6)`: NO backward (inference only).
- `torch_npu.optim.NpuFusedAdamW`: fused update; `zero_grad(set_to_none=True)` raises.
- `torch.optim.AdamW(..., fused=True)` and `F.scaled_dot_product_attention` have NPU kernels too.
- requires `import torch_npu`; nothing here was verified on hardware: measure.""",
}


def operator_catalog(target: str, pattern: str | None = None) -> str:
    """The target's operators for the prompt: trainbridge.targets.npu_catalog when present, else built-in."""
    if target == "npu":
        try:
            from ...targets import npu_catalog  # type: ignore[attr-defined]

            entries = list(npu_catalog.load_catalog())
            relevant = [e for e in entries if pattern and getattr(e, "pattern", None) == pattern]
            text = str(npu_catalog.render_for_prompt(relevant or entries)).strip()
            others = [e for e in entries if e not in relevant] if relevant else []
            if others:
                text += "\n\nOther operators and knobs on npu (signatures only):\n" + "\n".join(
                    f"- {getattr(e, 'signature', None) or getattr(e, 'api', e)}" for e in others)
            if text:
                return text
        except Exception as e:  # the catalog module is optional
            log.debug("npu catalog unavailable (%s); using the built-in list", e)
    return _BUILTIN_CATALOG.get(target, _BUILTIN_CATALOG["cpu"])


def _profile_summary(profile, top: int = 10) -> str:
    if profile is None:
        return "(no profile given)"
    if isinstance(profile, dict):
        try:
            from ...profile.analysis import ProfileReport

            profile = ProfileReport.model_validate(profile)
        except Exception:
            return json.dumps(profile)[:2000]
    p = profile
    s = p.step
    lines = [
        f"- step: median {s.median_ms:.2f} ms (p10 {s.p10_ms:.2f}, p90 {s.p90_ms:.2f}, n={s.n})",
        f"- verdict: {p.verdict}; operator self time {p.op_self_ms_per_step:.2f} ms/step, outside operators "
        f"{p.outside_ops_ms_per_step:.2f} ms/step ({100 * p.outside_ops_share:.0f} %)",
        f"- shares of operator time: GEMM {100 * p.gemm_share:.0f} %, elementwise/reduction "
        f"{100 * p.elementwise_share:.0f} %, communication {100 * p.communication_share:.0f} %",
    ]
    if p.ops_per_step:
        lines.append(f"- {p.ops_per_step} operators per step ({p.distinct_ops or '?'} distinct)")
    if p.top_ops:
        lines.append("- top operators (self ms/step, calls/step, share):")
        lines += [f"    {o.name:<44} {o.self_ms_per_step:8.3f} {o.calls_per_step:8.1f} {100 * o.share:5.1f} %"
                  for o in p.top_ops[:top]]
    lines += [f"- {e}" for e in (p.evidence or [])[:5]]
    return "\n".join(lines)


def _intent_text(item, context: dict) -> str:
    head = f"{item.intent_id or '(no GPU intent)'}: {item.intent_summary or 'no summary'}"
    intent = context.get("intent")
    if isinstance(intent, BaseModel):
        intent = intent.model_dump()
    if isinstance(intent, dict):
        keep = {k: v for k, v in intent.items() if k not in ("id", "summary") and v not in (None, "", [], {})}
        if keep:
            head += "\nGPU evidence:\n" + json.dumps(keep, indent=1, default=str)[:4000]
    elif not item.intent_id:
        head += "\n(no GPU evidence for this item: it was planned from the target profile only)"
    return head


def _guard_spec(context: dict):
    """(protected regions, editable globs) when the context carries them (workload, manifest or lists)."""
    wl = context.get("workload")
    manifest = context.get("manifest") or getattr(wl, "manifest", None)
    protected = context.get("protected", getattr(manifest, "protected", None))
    editable = context.get("editable", getattr(manifest, "editable", None))
    if protected is None and editable is None:
        return None
    return list(protected or []), list(editable or ["*"])


def _protected_text(spec) -> str:
    if spec is None:
        return "(the manifest's protected regions are enforced by the harness; see the rules)"
    protected, editable = spec
    lines = [f"- editable files: {', '.join(editable)}"]
    for r in protected:
        what = ["the whole file"] if getattr(r, "whole_file", False) else []
        if getattr(r, "symbols", None):
            what.append("symbols " + ", ".join(r.symbols))
        if getattr(r, "names", None):
            what.append("assignments to " + ", ".join(r.names))
        lines.append(f"- {r.file}: {'; '.join(what) or '(nothing)'}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(lines)


def _qualname_span(text: str, qualname: str) -> tuple[int, int] | None:
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    parts = qualname.split(".")

    def find(body, i):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == parts[i]:
                if i == len(parts) - 1:
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    return start, node.end_lineno or node.lineno
                return find(node.body, i + 1)
        return None

    return find(tree.body, 0)


def _intent_spans(context: dict) -> list[tuple[str | None, int, int]]:
    """(file, first, last) lines from context['intent']['spans'] / 'lines', in a few accepted shapes."""
    intent = context.get("intent")
    if isinstance(intent, BaseModel):
        intent = intent.model_dump()
    raw = (intent or {}).get("spans") or (intent or {}).get("source_spans") or [] if isinstance(intent, dict) else []
    out = []
    for s in raw:
        if isinstance(s, BaseModel):
            s = s.model_dump()
        if isinstance(s, dict):
            a = s.get("line_start", s.get("start", s.get("line")))
            b = s.get("line_end", s.get("end", a))
            if isinstance(a, int):
                out.append((s.get("file"), a, b if isinstance(b, int) else a))
        elif isinstance(s, str):
            m = re.match(r"(.+?):(\d+)(?:-(\d+))?$", s)
            if m:
                out.append((m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))))
    return out


def _fence(text: str) -> str:
    return "```python\n" + text + ("" if text.endswith("\n") else "\n") + "```"


# ---------------------------------------------------------------- rewriter ----

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
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.__key = api_key or os.environ.get("OPENAI_API_KEY") or DUMMY_KEY
        self.max_repairs, self.max_retries = max_repairs, max_retries
        self.timeout_s = float(timeout_s)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.whole_file_lines, self.window_margin = whole_file_lines, window_margin
        self._sleep = sleep
        self.use_schema = True
        self.transcript: list[LLMExchange] = []
        self._answers: dict[str, LLMAnswer] = {}
        if client is None:
            import openai

            # openai.Timeout is the timeout class of the HTTP library this openai release is
            # built on (httpx in 1.x, httpx2 in 3.x): another library's class is refused.
            client = openai.OpenAI(api_key=self.__key, base_url=self.base_url, max_retries=0,
                                   timeout=openai.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)))
        elif hasattr(client, "with_options"):
            client = client.with_options(max_retries=0)
        self._client = client

    def __repr__(self) -> str:
        return f"LLMRewriter(model={self.model!r}, base_url={self.base_url!r})"

    # ------------------------------------------------------------ secrets ----
    def _redact(self, text):
        key = self.__key
        if isinstance(text, str) and key and key != DUMMY_KEY and len(key) >= 4:
            return text.replace(key, "[redacted]")
        return text

    def transcript_json(self) -> str:
        return self._redact(json.dumps([x.model_dump() for x in self.transcript], indent=1))

    # ------------------------------------------------------------- public ----
    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined:
        context = context or {}
        try:
            messages = self._base_messages(item, files, target, context)
        except Exception as e:
            return Declined(reason=f"llm:{self.model}: could not build the prompt: {type(e).__name__}: {e}")
        return self._run(item, files, files, target, context, messages, "propose")

    def repair(self, item, files: dict[str, str], target: str, context: dict, previous: Proposal,
               failure: str) -> Proposal | Declined:
        """Ask again with the exact failure of `previous`; new edits apply to previous.files."""
        context = context or {}
        try:
            messages = self._base_messages(item, files, target, context)
            prev_answer = self._answers.get(self._files_key(previous.files))
            messages = messages + self._repair_turn(
                prev_answer, previous_text=self._previous_text(prev_answer, files, previous),
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
                answer, ex = self._chat(messages, kind, item)
            except _GiveUp as g:
                return Declined(reason=f"llm:{self.model}: {g}")
            try:
                result = self._realize(answer, item, incumbent, base, target, context)
            except _Failure as f:
                ex.outcome = f"{f.stage}_failed" if f.stage in ("apply", "recipe", "guard") else "error"
                ex.error = self._redact(f.message)
                log.info("llm %s answer did not apply (%s): %s", self.model, f.stage, self._redact(f.message))
                if repairs_left <= 0:
                    return Declined(reason=f"llm:{self.model}: {f.stage} failed after {self.max_repairs} "
                                           f"repair(s): {f.message}")
                repairs_left -= 1
                stage = {"apply": "its edits could not be applied", "recipe": "the recipe could not be applied",
                         "guard": "the static guard rejected the candidate"}.get(f.stage, f.stage)
                same = "New edits apply to the same source as before:" if base is incumbent else (
                    "New edits apply to the candidate program below (a recipe applies to the incumbent):")
                messages = first_messages + self._repair_turn(
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

    def _chat(self, messages: list[dict], kind: str, item) -> tuple[LLMAnswer, LLMExchange]:
        """One answer that parses, after up to max_retries retries; _GiveUp with the last error otherwise."""
        import openai

        convo = list(messages)
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            ex = LLMExchange(kind=kind, attempt=attempt, time_utc=dt.datetime.now(dt.UTC).isoformat(),
                             model=self.model, base_url=self.base_url, plan_key=getattr(item, "key", None),
                             request_messages=[{"role": m["role"], "content": self._redact(m["content"])} for m in convo],
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
                resp = self._client.chat.completions.create(**kwargs)
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
                    ex.outcome, ex.error = "http_error", self._redact(last)
                    ex.latency_ms = 1000 * (time.monotonic() - t0)
                    raise _GiveUp(self._redact(last)) from None
            except openai.APIConnectionError as e:
                ex.outcome, last = "connection_error", f"connection error: {self._short(e)}"
            except Exception as e:  # anything the client raises on a broken response
                ex.outcome, last = "error", f"{type(e).__name__}: {self._short(e)}"
            else:
                ex.latency_ms = 1000 * (time.monotonic() - t0)
                raw, err = self._read(resp, ex)
                ex.raw_answer = self._redact(raw)
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
            ex.error = self._redact(last)
            log.warning("llm %s %s attempt %d/%d failed: %s", self.model, kind, attempt + 1, self.max_retries + 1,
                        ex.error)
            if attempt < self.max_retries and delay > 0:
                self._sleep(delay)
        raise _GiveUp(self._redact(f"gave up after {self.max_retries + 1} attempt(s); last error: {last}"))

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
        return self._redact(" ".join(str(e).split())[:300])

    # ------------------------------------------------------------ realize ----
    def _realize(self, answer: LLMAnswer, item, incumbent, base, target, context) -> Proposal | Declined:
        notes = [f"intent addressed: {answer.intent_addressed}",
                 f"model hypothesis: removes {', '.join(answer.hypothesis.ops_removed) or 'nothing named'}; "
                 f"saves {answer.hypothesis.predicted_saving_pct:g} %; reject if {answer.hypothesis.reject_if}"]
        if answer.recipe:
            from .recipes import RECIPES, NotApplicable

            recipe = RECIPES.get(answer.recipe)
            if recipe is None:
                raise _Failure("recipe", f"no recipe named {answer.recipe!r}; the library has: "
                                         f"{', '.join(sorted(RECIPES))}")
            if target not in recipe.targets:
                raise _Failure("recipe", f"recipe {recipe.name!r} does not support target {target!r} "
                                         f"(supports {', '.join(sorted(recipe.targets))})")
            site = getattr(item, "site", None) if recipe.name == getattr(item, "recipe", None) else None
            from .recipe_base import off_limits

            fence = off_limits(incumbent, context.get("protected"), context.get("editable"))
            out = recipe.apply(incumbent, target, site, protected=fence)
            if isinstance(out, NotApplicable):
                raise _Failure("recipe", f"recipe {recipe.name!r} does not apply: {out.reason}")
            new, mechanism = out.files, recipe.mechanism
            source = f"llm:{self.model}+recipe:{recipe.name}"
            description = out.description
            notes = [f"recipe {recipe.name} chosen by llm:{self.model}", *notes, *(out.notes or [])]
            low = recipe.pattern == "precision"
            ops = list(answer.hypothesis.ops_removed or out.ops_removed_estimate or [])
        elif answer.edits:
            try:
                new, _ = apply_edits(base, answer.edits)
            except EditError as e:
                raise _Failure("apply", str(e)) from None
            mechanism = answer.mechanism or f"{item.pattern}: {answer.intent_addressed}"
            source = f"llm:{self.model}"
            description = ""
            low = item.pattern == "precision" or lowers_precision(incumbent, new)
            ops = list(answer.hypothesis.ops_removed)
        else:
            return Declined(reason=f"llm:{self.model} proposed no change: {answer.intent_addressed}")
        changed = [rel for rel in new if new[rel] != incumbent.get(rel)]
        if not changed:
            raise _Failure("apply", "the change leaves the incumbent program exactly as it was")
        spec = _guard_spec(context)
        if spec is not None:
            from ..guard import check_candidate

            original = context.get("original") or incumbent
            verdict = check_candidate(original, new, spec[0], spec[1], target)
            if not verdict.passed:
                raise _Failure("guard", "\n".join(f"{v.rule} at {v.file}:{v.line}: {v.message}"
                                                  for v in verdict.violations if v.severity == "error"))
        return Proposal(source=source, files=new, changed_files=changed,
                        description=description or f"{mechanism} in {', '.join(changed)}", mechanism=mechanism,
                        notes=notes, low_precision=low, ops_removed=ops)

    @staticmethod
    def _files_key(files: dict[str, str]) -> str:
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()

    # ------------------------------------------------------------ prompts ----
    def _base_messages(self, item, files, target, context) -> list[dict]:
        return [{"role": "system", "content": render_prompt("system", target=target)},
                {"role": "user", "content": self._rewrite_prompt(item, files, target, context)}]

    def _rewrite_prompt(self, item, files, target, context) -> str:
        h = item.hypothesis
        history = context.get("history") or []
        spec = _guard_spec(context)
        return render_prompt(
            "rewrite", target=target, intent=_intent_text(item, context), pattern=item.pattern, level=item.level,
            gap_class=item.gap_class, site=item.site or "(whole program)",
            ops_removed=", ".join(h.ops_removed) or "(no operator named)",
            predicted_saving_ms=f"{h.predicted_saving_ms:g}", predicted_saving_pct=f"{h.predicted_saving_pct:g}",
            reject_if=h.reject_if, profile=_profile_summary(context.get("profile")),
            catalog=context.get("catalog") or operator_catalog(target, item.pattern),
            recipes=self._recipes_text(files, target), protected=_protected_text(spec),
            history="\n".join(f"- {x}" for x in history) or "(nothing yet)",
            source=self._source_view(files, item, target, context, spec),
        )

    def _recipes_text(self, files, target) -> str:
        from .recipes import RECIPES

        lines = []
        for r in RECIPES.values():
            if target not in r.targets:
                continue
            try:
                sites = r.find(files, target)
                where = ("applies at " + ", ".join(sorted({f"{s.file}:{s.qualname}" for s in sites}))[:300]
                         if sites else "finds no site in this program")
            except Exception:
                where = "site search failed"
            lines.append(f"- {r.name} ({r.pattern}, {r.level}): {r.mechanism}; {where}")
        return "\n".join(lines) or "(no recipe supports this target)"

    def _shown_files(self, files, spec) -> list[str]:
        import fnmatch

        py = [rel for rel in sorted(files) if rel.endswith(".py")]
        if spec is not None:
            whole = {r.file for r in spec[0] if getattr(r, "whole_file", False)}
            py = [rel for rel in py if rel not in whole and any(fnmatch.fnmatch(rel, g) for g in spec[1])]
        return py or sorted(files)

    def _source_view(self, files, item, target, context, spec) -> str:
        """Whole files when small, else the imports and windows of lines around the intent's sites."""
        spans: dict[str, list[tuple[int, int]]] = {}
        for f, a, b in _intent_spans(context):
            for rel in files:
                if f is None or rel == f or rel.endswith("/" + f) or f.endswith("/" + rel):
                    spans.setdefault(rel, []).append((a, b))
        quals = [item.site] if getattr(item, "site", None) else []
        if not quals:
            try:
                from .recipes import RECIPES

                r = RECIPES.get(item.recipe)
                quals = sorted({s.qualname for s in r.find(files, target)}) if r else []
            except Exception:
                quals = []
        for rel, text in files.items():
            if rel.endswith(".py"):
                for q in quals:
                    sp = _qualname_span(text, q)
                    if sp:
                        spans.setdefault(rel, []).append(sp)
        parts = []
        for rel in self._shown_files(files, spec):
            text = files[rel]
            lines = text.splitlines(keepends=True)
            n = len(lines)
            if n <= self.whole_file_lines or not spans.get(rel):
                shown = text if n <= self.whole_file_lines * 3 else "".join(lines[: self.whole_file_lines * 3])
                note = "" if shown == text else f" (first {self.whole_file_lines * 3} of {n} lines)"
                parts.append(f"## {rel} (whole file, {n} lines){note}\n{_fence(shown)}")
                continue
            m = self.window_margin
            wins = sorted([(1, min(n, 30))] + [(max(1, a - m), min(n, b + m)) for a, b in spans[rel]])
            merged: list[list[int]] = []
            for a, b in wins:
                if merged and a <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            chunks = []
            prev = 0
            for a, b in merged:
                if a > prev + 1:
                    chunks.append(f"# ... lines {prev + 1}-{a - 1} not shown ...\n")
                chunks.append("".join(lines[a - 1:b]))
                prev = b
            if prev < n:
                chunks.append(f"# ... lines {prev + 1}-{n} not shown ...\n")
            parts.append(f"## {rel} ({n} lines; windows {', '.join(f'{a}-{b}' for a, b in merged)} shown; "
                         f"`search` must come from the shown lines, not the '# ...' markers)\n"
                         f"{_fence(''.join(chunks))}")
        return "\n\n".join(parts)

    def _previous_text(self, prev_answer: LLMAnswer | None, incumbent, previous: Proposal) -> str:
        if prev_answer is not None:
            return "Your previous answer:\n```json\n" + prev_answer.model_dump_json(indent=1) + "\n```"
        diff = []
        for rel in sorted(set(incumbent) | set(previous.files)):
            a, b = incumbent.get(rel, ""), previous.files.get(rel, "")
            if a != b:
                diff.extend(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"incumbent/{rel}",
                                                 f"candidate/{rel}"))
        text = "".join(diff)
        if len(text) > 12000:
            text = text[:12000] + "\n... (diff truncated)\n"
        return (f"The previous candidate ({previous.source}: {previous.mechanism}) as a diff against the "
                f"incumbent:\n```diff\n{text}```")

    def _repair_turn(self, prev_answer, *, previous_text, failure, stage, base, base_note, item, target,
                     context) -> list[dict]:
        spec = _guard_spec(context)
        user = render_prompt("repair", stage=stage, previous=previous_text, failure=failure, base_note=base_note,
                             source=self._source_view(base, item, target, context, spec), target=target)
        turn = []
        if prev_answer is not None:
            turn.append({"role": "assistant", "content": prev_answer.model_dump_json()})
        turn.append({"role": "user", "content": user})
        return turn


_PRECISION = re.compile(r"bfloat16|float16|\.half\(|allow_tf32|allow_hf32|allow_bf16|allow_fp16|"
                        r"set_float32_matmul_precision|autocast")


def lowers_precision(before: dict[str, str], after: dict[str, str]) -> bool:
    """The edits add a line that lowers math precision (bf16/fp16 casts, autocast, TF32/HF32)."""
    for rel in after:
        a, b = before.get(rel, "").splitlines(), after[rel].splitlines()
        removed, added = set(), []
        for ln in difflib.unified_diff(a, b, lineterm="", n=0):
            if ln.startswith("-") and not ln.startswith("---"):
                removed.add(ln[1:].strip())
            elif ln.startswith("+") and not ln.startswith("+++"):
                added.append(ln[1:].strip())
        if any(_PRECISION.search(x) and x not in removed for x in added):
            return True
    return False


# ----------------------------------------------------------------- fallback ----

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
