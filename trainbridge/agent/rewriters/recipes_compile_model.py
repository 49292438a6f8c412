"""compile_model (L4): the whole model compiled, forward and the loss inside it, in place.

Where compile_region compiles one function, this is the whole-step choice the GPU program
usually makes (`model = torch.compile(model)`, which the naive port removes): every
elementwise chain of the forward, and of the loss when the model computes it, fuses, and the
backward is compiled with it. On a CPU that is the target's C++ Inductor backend.

The rewrite is one statement after the line that builds the model:
`model.compile(dynamic=False)`. `nn.Module.compile` compiles the module's call in place, so
the object stays the same: its parameters, its `state_dict` keys (no `_orig_mod.` prefix), the
optimizer built from it and a DDP wrapper around it all see the same module, and later
`.to(...)` / `.cuda()` calls (which return the module itself) keep the compiled call.
`dynamic=False`: a training step's shapes are static.

The model is found in the source: the program's `nn.Module` subclasses (across its files,
through program-defined bases), the ones no other program module builds inside itself are
roots, and a site is an assignment to a plain name, outside any class, whose value builds a
root (`GPT(cfg)`, `Net(...).to(device)`, `model: nn.Module = GPT(...)`). A program that already compiles that name is left
alone. Random ops are no obstacle to validation: the harness runs compiled code with
Inductor's `fallback_random`, so candidate and incumbent draw the same numbers.
"""

from __future__ import annotations

import libcst as cst

from ...pysource.edits import Edits
from ...pysource.shapes import call_name, dotted
from ...pysource.sites import positions
from ...pysource.syntax import code, stmt, walk
from .recipe_base import NotApplicable, Recipe, Site, _outside_protected, shorten

_MODULE_BASES = {"nn.Module", "torch.nn.Module", "Module"}


def _of(node, kind) -> list:
    """Every node of `kind` under `node`, outermost first."""
    return [n for n in walk(node) if isinstance(n, kind)]


def _class_defs(files: dict[str, str]) -> dict[str, list[tuple[str, cst.ClassDef]]]:
    """Class name -> (file, node) for every class the program defines."""
    out: dict[str, list[tuple[str, cst.ClassDef]]] = {}
    for rel, text in sorted(files.items()):
        if not rel.endswith(".py"):
            continue
        try:
            mod = positions(text).module
        except Exception:
            continue
        for node in _of(mod, cst.ClassDef):
            out.setdefault(node.name.value, []).append((rel, node))
    return out


def module_classes(files: dict[str, str]) -> set[str]:
    """Names of the program's nn.Module subclasses, through bases the program defines itself."""
    classes = _class_defs(files)
    bases = {name: {dotted(b.value) or "" for _, node in defs for b in node.bases} for name, defs in classes.items()}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, bs in bases.items():
            if name not in found and any(b in _MODULE_BASES or b.split(".")[-1] in found for b in bs):
                found.add(name)
                changed = True
    return found


def root_classes(files: dict[str, str]) -> set[str]:
    """Module classes no program module builds inside its own body, nor derives from: the models."""
    modules = module_classes(files)
    built_inside: set[str] = set()
    for name, defs in _class_defs(files).items():
        if name not in modules:
            continue
        for _, node in defs:
            built_inside |= {(dotted(b.value) or "").split(".")[-1] for b in node.bases}
            for call in _of(node, cst.Call):
                callee = (call_name(call) or "").split(".")[-1]
                if callee in modules and callee != name:
                    built_inside.add(callee)
    return modules - built_inside


def _builds(value: cst.BaseExpression, roots: set[str]) -> str | None:
    """The root class `value` builds, through method chains (`GPT(cfg).to(device)`), if any."""
    for call in _of(value, cst.Call):
        callee = (call_name(call) or "").split(".")[-1]
        if callee in roots and isinstance(call.func, (cst.Name, cst.Attribute)):
            return callee
    return None


def _compiled_already(text: str, name: str) -> bool:
    return f"torch.compile({name}" in text.replace(" ", "") or f"{name}.compile(" in text


class CompileModelRecipe(Recipe):
    def find(self, files, target, *, protected=None):
        if target not in self.targets:
            return []
        roots = root_classes(files)
        if not roots:
            return []
        out = []
        for rel in sorted(files):
            if not rel.endswith(".py"):
                continue
            try:
                pos = positions(files[rel])
            except cst.ParserSyntaxError:
                continue
            inside_classes = {id(n) for c in _of(pos.module, cst.ClassDef) for n in _of(c, (cst.Assign, cst.AnnAssign))}
            for line in _of(pos.module, cst.SimpleStatementLine):
                assign = line.body[0] if len(line.body) == 1 else None
                if id(assign) in inside_classes:
                    continue
                if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
                    target_node = assign.targets[0].target
                elif isinstance(assign, cst.AnnAssign) and assign.value is not None:  # `model: nn.Module = GPT(...)`
                    target_node = assign.target
                else:
                    continue
                if not isinstance(target_node, cst.Name):
                    continue
                built = _builds(assign.value, roots)
                if built is None or _compiled_already(files[rel], target_node.value):
                    continue
                out.append(Site(file=rel, qualname=pos.qualnames().get(pos.line(line), "<module>"),
                                line=pos.line(line), end_line=pos.end_line(line), text=shorten(code(line)),
                                detail={"model": target_node.value, "class": built}))
        return _outside_protected(out, files, protected)

    def _no_site_reason(self, files, target):
        roots = sorted(root_classes(files))
        if not roots:
            return "compile_model: the program defines no nn.Module subclass"
        return (f"compile_model: no assignment outside a class builds the model ({', '.join(roots)}), or the "
                "program compiles it already")

    def _rewrite_file(self, rel, text, target, sites):
        pos = positions(text)
        lines = {s.line: s for s in sites}
        edits, done = Edits(), []
        for line in _of(pos.module, cst.SimpleStatementLine):
            s = lines.get(pos.line(line))
            if s is None or s in done:
                continue
            backend = ', backend="npu"' if target == "npu" else ""
            compiled = stmt(f"{s.detail['model']}.compile(dynamic=False{backend})  # trainbridge compile_model: "
                            "the whole model, forward and backward, compiled in place")
            edits.sub(line, cst.FlattenSentinel([line, compiled]))
            done.append(s)
        if not done:
            return NotApplicable(reason="compile_model: the model's assignment was not found again")
        notes = ["compiles the whole model in place (nn.Module.compile); the first steps pay the compile (the "
                 "harness's warm-up steps absorb it)"]
        if target == "cpu":
            notes.append("Inductor on cpu needs a C++ compiler at run time")
        return edits.apply(pos.module).code, done, notes
