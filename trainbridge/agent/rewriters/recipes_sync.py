"""remove_host_sync (L1): `.item()` in the training loop, used only for logging, off the hot path.

An asynchronous device (npu, cuda) makes the host wait at every `.item()` until all queued
work is done, so the next step's launches cannot overlap this step's kernels. When the
value read is only printed/logged, the read is moved under a logging condition:

* already conditional (`v = loss.item()` every step, `if step % 10 == 0: print(v)`): the read
  moves into that `if` block; output unchanged;
* unconditional (every step logs it): the read and the log statements that use it run every
  `_TB_LOG_EVERY` steps of the loop counter (the log shows fewer train-loss lines; the
  harness reads the loss itself, through backward()).

Never applied when the value feeds control flow, arithmetic, a list, or anything after
the loop, when the loop has no counter, or inside a protected region.

Targets: npu and cuda only. A CPU runs every operator synchronously in the calling thread,
so by the time `.item()` runs the value is already there: there is no device queue to
drain, and the read costs a scalar copy.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.edits import Edits
from ...pysource.imports import insert_after_imports
from ...pysource.names import assigned_names, load_names, target_names
from ...pysource.shapes import call_name, dotted
from ...pysource.sites import positions, iter_functions
from ...pysource.syntax import code, stmt, walk
from .recipe_base import Recipe, Site, shorten

LOG_EVERY = 10
_LOG_CALLS = {"print", "print0", "log", "info", "debug", "warning", "write", "add_scalar", "add_scalars", "log_metrics",
              "log_dict", "set_postfix", "set_description"}
_LOG_ROOTS = {"logger", "logging", "log", "wandb", "writer", "tb", "pbar", "tqdm", "sys"}


def _is_log_stmt(s) -> bool:
    if not m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.Call())])):
        return False
    call = s.body[0].value
    name = call_name(call)
    d = dotted(call.func) or ""
    return name in _LOG_CALLS and (isinstance(call.func, cst.Name) or d.split(".")[0] in _LOG_ROOTS or name in ("print", "print0"))


def _item_read(s):
    """(name, value) for `name = <expr>.item()` / `.tolist()` statements."""
    if not m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
        return None
    a = s.body[0]
    v = a.value
    if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in ("item", "tolist") and not v.args:
        return a.targets[0].target.value, v
    return None


def _has_item(node) -> bool:
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "item"
               and not n.args for n in walk(node))


def _loop_counter(loop) -> str | None:
    if isinstance(loop, cst.For):
        it = loop.iter
        names = target_names(loop.target)
        if isinstance(it, cst.Call) and call_name(it) == "range" and isinstance(loop.target, cst.Name):
            return loop.target.value
        if isinstance(it, cst.Call) and call_name(it) == "enumerate" and isinstance(loop.target, cst.Tuple) and names:
            return names[0]
        return None
    if isinstance(loop, cst.While):
        for s in loop.body.body:
            if m.matches(s, m.SimpleStatementLine(body=[m.AugAssign(target=m.Name(), operator=m.AddAssign())])):
                return s.body[0].target.value
    return None


def _training_loops(fn: cst.FunctionDef):
    for node in walk(fn.body):
        if isinstance(node, (cst.For, cst.While)) and ".backward(" in code(node):
            yield node


class _Plan:
    def __init__(self, loop, counter, kind, read_stmt=None, uses=(), inline=None, name=""):
        self.loop, self.counter, self.kind = loop, counter, kind
        self.read_stmt, self.uses, self.inline, self.name = read_stmt, list(uses), inline, name


class HostSyncRecipe(Recipe):
    def _plans(self, rel, text):
        pos = positions(text)
        plans, misses = [], []
        for fi in iter_functions(pos.module):
            for loop in _training_loops(fi.node):
                counter = _loop_counter(loop)
                body = list(loop.body.body)
                after = _after_loop_reads(fi.node, loop)
                guarded: set[int] = set()  # log statements an earlier read's plan already guards
                for i, s in enumerate(body):
                    got = _item_read(s)
                    if got is not None:
                        name, value = got
                        where = f"{rel}:{pos.line(s)} {fi.qualname}"
                        reads_before = any(load_names(x)[name] for x in body[:i])
                        uses = [(j, x) for j, x in enumerate(body) if j > i and load_names(x)[name]]
                        if reads_before or name in after:
                            misses.append(f"{where}: {name} is read outside this step's logging")
                            continue
                        if not uses:
                            continue
                        srcs = set(load_names(value))
                        between = set()
                        for j, x in enumerate(body):
                            if i < j < uses[0][0]:
                                between |= assigned_names(x)
                        if srcs & between:
                            misses.append(f"{where}: {sorted(srcs & between)} change before the log line")
                            continue
                        if all(_is_log_stmt(x) for _, x in uses):
                            if counter is None:
                                misses.append(f"{where}: the loop has no step counter to guard the log with")
                                continue
                            plans.append((fi, _Plan(loop, counter, "guard", s, [x for _, x in uses], name=name), s))
                            guarded |= {id(x) for _, x in uses}
                        elif len(uses) == 1 and isinstance(uses[0][1], cst.If) and _only_logs_read(uses[0][1], name):
                            plans.append((fi, _Plan(loop, counter, "move", s, [uses[0][1]], name=name), s))
                        else:
                            misses.append(f"{where}: {name} feeds something other than a log line")
                    elif _is_log_stmt(s) and _has_item(s) and id(s) not in guarded:
                        # (a log line that also reads a value guarded above is guarded once, by that
                        # read's plan: a second plan would replace the same statement without the read)
                        if counter is None:
                            misses.append(f"{rel}:{pos.line(s)} {fi.qualname}: the loop has no step counter")
                            continue
                        plans.append((fi, _Plan(loop, counter, "guard", None, [s], inline=True), s))
        return pos, plans, misses

    def _find_file(self, rel, text, target):
        pos, plans, _ = self._plans(rel, text)
        return [Site(file=rel, qualname=fi.qualname, line=pos.line(s), end_line=pos.end_line(s),
                     text=shorten(code(s)), detail={"kind": p.kind, "counter": p.counter or ""}) for fi, p, s in plans]

    def _rewrite_file(self, rel, text, target, sites):
        pos, plans, _ = self._plans(rel, text)
        want = {(s.qualname, s.line) for s in sites}
        edits, done, need_const = Edits(), [], False
        for fi, p, s in plans:
            if (fi.qualname, pos.line(s)) not in want:
                continue
            site = next(x for x in sites if (x.qualname, x.line) == (fi.qualname, pos.line(s)))
            if p.kind == "move":
                edits.drop(p.read_stmt)
                block = p.uses[0]
                body = list(block.body.body)
                block_new = block.with_changes(body=block.body.with_changes(body=[p.read_stmt, *body]))
                edits.sub(block, block_new)
            else:
                need_const = True
                cond = f"{p.counter} % _TB_LOG_EVERY == 0"
                if p.read_stmt is not None:
                    edits.drop(p.read_stmt)
                for k, u in enumerate(p.uses):
                    inner = [u.with_changes(leading_lines=[])]
                    if k == 0 and p.read_stmt is not None:
                        comments = [ln for ln in p.read_stmt.leading_lines if ln.comment is not None]
                        inner.insert(0, p.read_stmt.with_changes(leading_lines=comments))
                    guarded = cst.If(test=cst.parse_expression(cond),
                                     body=cst.IndentedBlock(body=inner),
                                     leading_lines=u.leading_lines)
                    edits.sub(u, guarded)
            done.append(site)
        module = edits.apply(pos.module)
        notes = []
        if need_const and "_TB_LOG_EVERY" not in text:
            module = insert_after_imports(module, [stmt(f"_TB_LOG_EVERY = {LOG_EVERY}  # trainbridge remove_host_sync: "
                                                        "steps between host reads of logged values")])
            notes.append(f"per-step log lines that read a device value now print every {LOG_EVERY} steps "
                         "(the harness reads the loss itself)")
        return module.code, done, notes

    def _no_site_reason(self, files, target):
        misses = []
        for rel in sorted(files):
            if rel.endswith(".py"):
                try:
                    misses.extend(self._plans(rel, files[rel])[2])
                except Exception:
                    pass
        if misses:
            return "remove_host_sync: .item() reads found but not only for logging: " + "; ".join(misses[:4])
        return "remove_host_sync: no .item()/.tolist() read in a training loop (a loop calling .backward())"


def _only_logs_read(block: cst.If, name: str) -> bool:
    if block.orelse is not None:
        return False
    if load_names(block.test)[name]:
        return False
    for s in block.body.body:
        if load_names(s)[name] and not _is_log_stmt(s):
            return False
    return True


def _after_loop_reads(fn: cst.FunctionDef, loop) -> set[str]:
    """Names read in the function outside the loop (anything the loop's values could feed)."""
    out = set()

    def visit(node):
        if node is loop:
            return
        if isinstance(node, cst.Name):
            out.add(node.value)
        for c in node.children:
            visit(c)

    visit(fn.body)
    return out
