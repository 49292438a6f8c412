"""The chat messages: the rewrite request, a repair turn, and the program as the model sees it.

A first proposal is two messages, the system rules and the rewrite request; a repair adds the
previous answer (or, for a candidate the model did not write, its diff) and the exact failure.
Programs are often too long to send whole, so a long file is shown as its imports plus windows
of lines around the intent's sites (from the plan item, the recipe's site finder, or the GPU
intent's source spans); only the files the manifest lets the model edit are shown.
"""

from __future__ import annotations

import difflib

from ..base import Proposal
from .answer import LLMAnswer
from .catalog import operator_catalog
from .context import guard_spec, intent_spans
from .prompt import intent_text, profile_summary, protected_text, render_prompt


class PromptWriter:
    """Builds the messages of one request; the sizes decide when a file is shown in windows."""

    def __init__(self, whole_file_lines: int = 400, window_margin: int = 25):
        self.whole_file_lines, self.window_margin = whole_file_lines, window_margin

    def base_messages(self, item, files, target, context) -> list[dict]:
        return [{"role": "system", "content": render_prompt("system", target=target)},
                {"role": "user", "content": self.rewrite_prompt(item, files, target, context)}]

    def rewrite_prompt(self, item, files, target, context) -> str:
        h = item.hypothesis
        history = context.get("history") or []
        spec = guard_spec(context)
        return render_prompt(
            "rewrite", target=target, intent=intent_text(item, context), pattern=item.pattern, level=item.level,
            gap_class=item.gap_class, site=item.site or "(whole program)",
            ops_removed=", ".join(h.ops_removed) or "(no operator named)",
            predicted_saving_ms=f"{h.predicted_saving_ms:g}", predicted_saving_pct=f"{h.predicted_saving_pct:g}",
            reject_if=h.reject_if, profile=profile_summary(context.get("profile")),
            catalog=context.get("catalog") or operator_catalog(target, item.pattern),
            recipes=self.recipes_text(files, target), protected=protected_text(spec),
            history="\n".join(f"- {x}" for x in history) or "(nothing yet)",
            source=self.source_view(files, item, target, context, spec),
        )

    def recipes_text(self, files, target) -> str:
        from ..recipes import RECIPES

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

    def shown_files(self, files, spec) -> list[str]:
        import fnmatch

        py = [rel for rel in sorted(files) if rel.endswith(".py")]
        if spec is not None:
            whole = {r.file for r in spec[0] if getattr(r, "whole_file", False)}
            py = [rel for rel in py if rel not in whole and any(fnmatch.fnmatch(rel, g) for g in spec[1])]
        return py or sorted(files)

    def source_view(self, files, item, target, context, spec) -> str:
        """Whole files when small, else the imports and windows of lines around the intent's sites."""
        spans: dict[str, list[tuple[int, int]]] = {}
        for f, a, b in intent_spans(context):
            for rel in files:
                if f is None or rel == f or rel.endswith("/" + f) or f.endswith("/" + rel):
                    spans.setdefault(rel, []).append((a, b))
        quals = [item.site] if getattr(item, "site", None) else []
        if not quals:
            try:
                from ..recipes import RECIPES

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
        for rel in self.shown_files(files, spec):
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

    def previous_text(self, prev_answer: LLMAnswer | None, incumbent, previous: Proposal) -> str:
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

    def repair_turn(self, prev_answer, *, previous_text, failure, stage, base, base_note, item, target,
                     context) -> list[dict]:
        spec = guard_spec(context)
        user = render_prompt("repair", stage=stage, previous=previous_text, failure=failure, base_note=base_note,
                             source=self.source_view(base, item, target, context, spec), target=target)
        turn = []
        if prev_answer is not None:
            turn.append({"role": "assistant", "content": prev_answer.model_dump_json()})
        turn.append({"role": "user", "content": user})
        return turn


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


def _fence(text: str) -> str:
    return "```python\n" + text + ("" if text.endswith("\n") else "\n") + "```"
