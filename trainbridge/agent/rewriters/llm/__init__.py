"""The language-model rewriter: any OpenAI-compatible chat endpoint writes the candidate.

The model is shown the program around the intent's sites, the intent and its GPU
evidence, the target's profile, the target's operators (exact signatures and caveats),
the recipe library and what was tried before; it answers one JSON object (`LLMAnswer`):
either a library recipe by name, or search-and-replace edits (`rewriters.edits`). Answers
that do not apply go back to the model with the exact failure; transport failures and
garbage answers are retried with backoff; every exchange is kept in a transcript without
the key.

The parts, one job each:
- `prompt`: the prompt templates and the context parts rendered into them,
- `catalog`: the target's operators as the prompt lists them,
- `context`: the guard spec and intent spans read from the loop's context dict,
- `messages`: the chat messages, with long files shown as windows around the sites,
- `answer`: the answer schema and parsing it out of the model's text,
- `client`: the endpoint, with retries, backoff, the transcript and redaction,
- `realise`: an answer applied to the program as a guard-checked Proposal,
- `rewriter`: `LLMRewriter` tying these together, and `WithFallback`.
"""

from .answer import (
    ANSWER_SCHEMA,
    LEVELS,
    RESPONSE_FORMAT,
    AnswerError,
    LLMAnswer,
    LLMHypothesis,
    parse_answer,
)
from .catalog import operator_catalog
from .client import DUMMY_KEY, ChatClient, LLMExchange
from .messages import PromptWriter
from .prompt import PROMPTS_ENV, load_prompt, prompts_dir, render_prompt
from .realise import lowers_precision
from .rewriter import LLMRewriter, WithFallback

__all__ = [
    "ANSWER_SCHEMA", "DUMMY_KEY", "LEVELS", "PROMPTS_ENV", "RESPONSE_FORMAT", "AnswerError", "ChatClient",
    "LLMAnswer", "LLMExchange", "LLMHypothesis", "LLMRewriter", "PromptWriter", "WithFallback", "load_prompt",
    "lowers_precision", "operator_catalog", "parse_answer", "prompts_dir", "render_prompt",
]
