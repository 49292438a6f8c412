"""Check a scaled record without running it: its hyperparameter section, evaluated alone.

The records cannot run here before their other ports (FlexAttention, FA3, Triton, FP8,
torchrun), but the values the scale override wrote can be checked against the record's own
rules. From the scaled source this executes only what defines hyperparameters, as one
process (world_size 1, rank 0, device "cpu"):

- imports of the standard library, torch and numpy;
- classes named `...Hyperparameters`, `...Config`, `...Stage`, `...Schedule`; every
  top-level function, without its decorators (a definition runs nothing);
- module assignments whose right side uses only names defined so far and touches no
  device, process group, file or kernel (`args = Hyperparameters()`, `grad_accum_steps`,
  `TRAINING_STAGES`, `training_schedule`, `ws_schedule`); argparse `add_argument` calls,
  with `parse_args([])`;
- the record's asserts, at module level and inside functions, where every name they use
  is one of those module values (`assert args.val_tokens % args.val_batch_size == 0`);
- each `get_*(step)` schedule function at every step of the scaled run.

Then the invariants the records rely on without a module-level assert: the model's
`num_heads * head_dim == model_dim`, an even layer count for U-net pairings, micro-batches
that are whole attention blocks and fit the rotary tables (`max_seq_len`), batch sizes
divisible by processes x accumulation steps, step counts within the run. Each failure is a
problem naming the construct.
"""

from __future__ import annotations

import ast
import builtins
import sys
import traceback
import types
from dataclasses import dataclass, field

FILENAME = "<scaled record>"
MODULE = "trainbridge_scaled_record"
SAFE_IMPORTS = {"os", "sys", "math", "uuid", "time", "glob", "copy", "itertools", "functools", "dataclasses",
                "typing", "collections", "pathlib", "random", "torch", "numpy", "contextlib", "re", "json",
                "statistics", "argparse", "abc", "enum", "operator", "gc"}
STUBS = {"world_size": 1, "rank": 0, "local_rank": 0, "ddp_world_size": 1, "ddp_rank": 0, "ddp_local_rank": 0,
         "device": "cpu", "master_process": True, "num_processes": 1}
BANNED = ("cuda", "dist.", "open(", "get_kernel", "DataLoader", "data_generator", "compile(", "DDP(",
          "init_process_group", "load_data_shard", "print(", "GPT(", "model", "optimizer", "environ[")
SAFE_CLASSES = ("Hyperparameters", "Config", "Stage", "Schedule")
MAX_SCHEDULE_STEPS = 5000


@dataclass
class CheckResult:
    values: dict[str, object] = field(default_factory=dict)  # the evaluated hyperparameters (args.*)
    model: dict[str, object] = field(default_factory=dict)  # the model constructor's evaluated keywords
    asserts_checked: int = 0
    invariants_checked: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Ignored(Exception):
    pass


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _about_device(node: ast.AST) -> bool:
    """An assert about the machine (`torch.cuda.is_available()`), not about hyperparameters."""
    text = ast.unparse(node)
    return any(w in text for w in ("cuda", "dist.", "torch.", "device"))


def _own_failure(exc: BaseException) -> bool:
    """Whether an exception was raised by the record's own code (not by torch or a missing stub)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename == FILENAME


def _run(node: ast.stmt, ns: dict) -> None:
    code = compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), FILENAME, "exec")
    exec(code, ns)


class _ParseArgsEmpty(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("parse_args", "parse_known_args") \
                and not node.args:
            node.args = [ast.List(elts=[], ctx=ast.Load())]
        return node


def evaluate(source: str) -> tuple[dict, CheckResult]:
    """The namespace of the hyperparameter section, and what failed on the way."""
    res = CheckResult()
    tree = _ParseArgsEmpty().visit(ast.parse(source))
    module = types.ModuleType(MODULE)  # dataclasses look their class's module up in sys.modules
    sys.modules[MODULE] = module
    ns: dict = module.__dict__
    ns.update(STUBS)
    known = set(dir(builtins)) | set(ns)
    for stmt in tree.body:
        try:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
                if all(m.split(".")[0] in SAFE_IMPORTS for m in mods) and getattr(stmt, "level", 0) == 0:
                    _run(stmt, ns)
            elif isinstance(stmt, ast.ClassDef) and stmt.name.endswith(SAFE_CLASSES):
                _run(stmt, ns)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                _run(type(stmt)(**{**{f: getattr(stmt, f) for f in stmt._fields}, "decorator_list": []}), ns)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = [n for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t])]
                if stmt.value is None or not all(isinstance(n, ast.Name) for n in names) \
                        or any(n.id in STUBS for n in names):
                    continue
                text = ast.unparse(stmt.value)
                if _names(stmt.value) - set(ns) - known or any(b in text for b in BANNED):
                    continue
                _run(stmt, ns)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                    and isinstance(stmt.value.func, ast.Attribute) \
                    and stmt.value.func.attr in ("add_argument", "set_defaults") \
                    and not _names(stmt.value) - set(ns) - known:
                _run(stmt, ns)
            elif isinstance(stmt, ast.Assert):
                if not _names(stmt.test) - set(ns) - known and not _about_device(stmt.test):
                    res.asserts_checked += 1
                    _check_assert(stmt, ns, res, "module")
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:  # a statement that needs what is not here: not a hyperparameter
            if _own_failure(e) and isinstance(e, (AssertionError, IndexError, KeyError, ZeroDivisionError)):
                res.problems.append(f"line {stmt.lineno} `{ast.unparse(stmt)[:80]}` raises {type(e).__name__}: "
                                    f"{e}"[:240])
            elif isinstance(stmt, ast.ClassDef):
                res.notes.append(f"class {stmt.name} (line {stmt.lineno}) not evaluated: {type(e).__name__}: {e}"[:200])
            continue
    if ns.get("args") is None and isinstance(ns.get("Hyperparameters"), type):
        try:  # `args` made inside main(): the class's defaults are the hyperparameters
            ns["args"] = ns["Hyperparameters"]()
        except Exception:
            pass
    args = ns.get("args")
    if args is not None:  # fields of a dataclass (slots or not), a plain class, or an argparse Namespace
        for k in dir(args):
            if not k.startswith("_"):
                try:
                    v = getattr(args, k)
                except Exception:
                    continue
                if isinstance(v, (int, float, str, bool, tuple, list)):
                    res.values[k] = v
    return ns, res


def _check_assert(stmt: ast.Assert, ns: dict, res: CheckResult, where: str) -> None:
    try:
        _run(stmt, ns)
    except AssertionError:
        text = ast.unparse(stmt.test)
        why = (" — a one-process run fails it; the torchrun port has to relax it" if "world_size" in text
               and not any(k in text for k in ("batch", "tokens", "seq")) else "")
        res.problems.append(f"the record's assert fails ({where}, line {stmt.lineno}): `{text}`{why}")
    except Exception:
        pass  # needs a value only the running program has


def _nested_asserts(tree: ast.Module, ns: dict, res: CheckResult, seen: set[str]) -> None:
    """Asserts in the module's loops and branches (the training loop), with the plain
    assignments before them (`val_bs = world_size * args.seq_len`) run in a scratch copy."""
    scratch = dict(ns)
    known = set(dir(builtins))

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
                text = ast.unparse(stmt.value)
                if not _names(stmt.value) - set(scratch) - known and not any(b in text for b in BANNED):
                    try:
                        _run(stmt, scratch)
                    except Exception:
                        pass
            elif isinstance(stmt, ast.Assert):
                text = ast.unparse(stmt.test)
                if text not in seen and not _names(stmt.test) - set(scratch) - known and not _about_device(stmt.test):
                    seen.add(text)
                    res.asserts_checked += 1
                    _check_assert(stmt, scratch, res, "in the training loop")
            elif isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, part, []) or [])
                for handler in getattr(stmt, "handlers", []):
                    visit(handler.body)

    visit([s for s in tree.body if isinstance(s, (ast.For, ast.While, ast.If, ast.With, ast.Try))])


def _function_asserts(tree: ast.Module, ns: dict, res: CheckResult, seen: set[str]) -> None:
    """Asserts inside functions whose names are all module values (`args.*`, `world_size` ...)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs, *fn.args.posonlyargs]}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert):
                used = _names(node.test)
                text = ast.unparse(node.test)
                if not used or used & local or used - set(ns) or text in seen or _about_device(node.test):
                    continue
                seen.add(text)
                res.asserts_checked += 1
                _check_assert(node, ns, res, f"in {fn.name}()")


def _model_call(tree: ast.Module) -> ast.Call | None:
    for stmt in tree.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "GPT":
                return node
    return None


def _eval(node: ast.AST, ns: dict):
    try:
        return eval(compile(ast.Expression(body=node), FILENAME, "eval"), ns)
    except Exception:
        return None


def model_config(tree: ast.Module, ns: dict) -> dict[str, object]:
    """The model constructor's keywords, evaluated (a GPTConfig(...) argument is opened)."""
    call = _model_call(tree)
    if call is None:
        return {}
    out: dict[str, object] = {}
    inner = [a for a in call.args if isinstance(a, ast.Call) and isinstance(a.func, ast.Name)
             and a.func.id.endswith("Config")]
    for c in [*inner, call]:
        if isinstance(c.func, ast.Name) and c.func.id in ns:  # the config class's defaults first
            cls = ns[c.func.id]
            out.update({k: v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, (int, float))})
        for kw in c.keywords:
            if kw.arg:
                out[kw.arg] = _eval(kw.value, ns)
    alias = {"n_layer": "num_layers", "n_head": "num_heads", "n_embd": "model_dim"}
    return {alias.get(k, k): v for k, v in out.items()}


def check(source: str, *, even_layers: bool = False, layer_ties: list[str] | None = None,
          record_layers: int | None = None) -> CheckResult:
    """Evaluate the scaled record's hyperparameters and report what breaks its rules."""
    tree = ast.parse(source)
    old_argv = sys.argv
    try:
        sys.argv = [FILENAME]
        ns, res = evaluate(source)
        seen: set[str] = set()
        _function_asserts(tree, ns, res, seen)
        _nested_asserts(tree, ns, res, seen)
        res.model = {k: v for k, v in model_config(tree, ns).items() if v is not None}
        _invariants(source, ns, res, even_layers=even_layers, layer_ties=layer_ties or [],
                    record_layers=record_layers)
        _schedules(tree, ns, res)
    finally:
        sys.argv = old_argv
        sys.modules.pop(MODULE, None)
    return res


def _invariants(source: str, ns: dict, res: CheckResult, *, even_layers, layer_ties, record_layers) -> None:
    def need(ok: bool, problem: str) -> None:
        res.invariants_checked += 1
        if not ok:
            res.problems.append(problem)

    m, args = res.model, ns.get("args")
    world = ns.get("world_size", 1)
    ga = ns.get("grad_accum_steps", 1) if isinstance(ns.get("grad_accum_steps"), int) else 1
    layers, heads, hd, width = (m.get(k) for k in ("num_layers", "num_heads", "head_dim", "model_dim"))
    if isinstance(heads, int) and isinstance(width, int):
        if isinstance(hd, int):
            if "head_dim must equal model_dim" in source or "hdim == dim" in source:
                need(heads * hd == width, f"model: num_heads * head_dim = {heads} * {hd} != model_dim {width} "
                                          f"(the record asserts they are equal)")
            need(hd % 4 == 0, f"model: head_dim {hd}: the rotary embedding splits it in quarters")
        else:
            need(width % heads == 0, f"model: model_dim {width} is not a multiple of num_heads {heads}")
            need(width // max(heads, 1) % 4 == 0, f"model: head size {width}/{heads}: the rotary embedding "
                                                  f"splits it in quarters")
    if isinstance(layers, int):
        if even_layers:
            need(layers % 2 == 0, f"model: num_layers {layers} is odd, the U-net pairing asserts num_layers % 2 == 0")
        if layer_ties and record_layers:
            need(layers == record_layers, f"model: num_layers {layers}, but the model code is written for "
                                          f"{record_layers} layers ({layer_ties[0]})")
    get = (lambda k: getattr(args, k, None)) if args is not None else (lambda k: None)
    max_seq = m.get("max_seq_len")
    batches: list[tuple[str, int]] = []
    for name in ("train_batch_size", "train_bs_extension"):
        if isinstance(get(name), int):
            batches.append((f"args.{name}", get(name)))
    if isinstance(get("train_bs_schedule"), (tuple, list)):
        batches += [(f"args.train_bs_schedule[{i}]", v) for i, v in enumerate(get("train_bs_schedule"))]
    for i, stage in enumerate(ns.get("TRAINING_STAGES") or []):
        if isinstance(getattr(stage, "batch_size", None), int):
            batches.append((f"TRAINING_STAGES[{i}].batch_size", stage.batch_size))
    micro: list[tuple[str, int]] = []
    for label, v in batches:
        need(v % (world * ga) == 0, f"{label} = {v} is not divisible by world_size * grad_accum_steps = {world * ga}")
        micro.append((f"{label} per micro-step", v // (world * ga)))
    for name in ("sequence_length", "seq_len", "train_seq_len"):
        if isinstance(get(name), int):
            micro.append((f"args.{name}", get(name)))
    flex = "BLOCK_SIZE == 0" in source or "% BLOCK_SIZE" in source
    varlen = "T % 16 == 0" in source
    for label, t in micro:
        need(t > 0, f"{label} = {t} tokens")
        if flex:
            need(t % 128 == 0, f"{label} = {t}: FlexAttention sequences are whole 128-token blocks")
        if varlen:
            need(t % 16 == 0, f"{label} = {t}: the varlen attention asserts T % 16 == 0")
        if isinstance(max_seq, int):
            need(t <= max_seq, f"{label} = {t} exceeds the model's max_seq_len {max_seq} (rotary tables)")
    if "batch size = 1 for FlexAttention" in source and isinstance(get("device_batch_size"), int):
        need(get("device_batch_size") == 1, f"args.device_batch_size = {get('device_batch_size')}: the "
                                            f"FlexAttention model asserts one sequence per device (B == 1)")
    if isinstance(get("val_batch_size"), int) and isinstance(max_seq, int):
        need(get("val_batch_size") // (world * ga) <= max_seq,
             f"args.val_batch_size per process exceeds max_seq_len {max_seq}")
    total = _total_steps(ns)
    if total is not None:
        need(total >= 1, f"the run has {total} steps")
        for name in ("warmdown_iters", "cooldown_iters", "warmup_iters"):
            if isinstance(get(name), int):
                need(get(name) <= total, f"args.{name} = {get(name)} exceeds the run's {total} steps")
    bd = get("bigram_dim")
    if isinstance(bd, int) and isinstance(width, int):
        need(bd <= width, f"args.bigram_dim {bd} > model_dim {width} (x[..., :bigram_dim] is added in place)")


def _total_steps(ns: dict) -> int | None:
    sched = ns.get("training_schedule")
    if sched is not None and isinstance(getattr(sched, "total_steps", None), int):
        return sched.total_steps
    args = ns.get("args")
    if args is None:
        return None
    total = getattr(args, "num_iterations", None)
    if not isinstance(total, int):
        s, e = getattr(args, "num_scheduled_iterations", None), getattr(args, "num_extension_iterations", 0)
        total = s + e if isinstance(s, int) else None
    ext = getattr(args, "iteration_extension", 0)
    return total + ext if isinstance(total, int) and isinstance(ext, int) else total


def _schedules(tree: ast.Module, ns: dict, res: CheckResult) -> None:
    """Every one-argument `get_*` schedule function at every step of the run."""
    total = _total_steps(ns)
    if total is None or total > MAX_SCHEDULE_STEPS:
        return
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("get_") and fn.name in ns):
            continue
        required = len(fn.args.args) - len(fn.args.defaults)
        if required != 1:
            continue
        res.invariants_checked += 1
        for step in range(total):  # the loop calls schedules before each of its `total` steps
            try:
                ns[fn.name](step)
            except Exception as e:
                if _own_failure(e) and isinstance(e, (IndexError, KeyError, ZeroDivisionError, AssertionError)):
                    res.problems.append(f"schedule {fn.name}(step={step}) of {total} raises "
                                        f"{type(e).__name__}: {e}"[:200])
                break
    sched = ns.get("training_schedule")
    if sched is not None and hasattr(sched, "lookup"):
        res.invariants_checked += 1
        try:
            for step in range(total + 1):
                sched.lookup(step)
                if hasattr(sched, "get_lr"):
                    sched.get_lr(step)
        except Exception as e:
            res.problems.append(f"training_schedule at step {step} of {total} raises {type(e).__name__}: {e}"[:200])

