"""The rules that keep what the harness owns as it was: protected symbols, names, fields and calls.

A protected function or class stays textually the same and defined once, a protected
module-level name keeps exactly its assignments, a protected config's fields are not
overwritten, and calls to protected functions keep their arguments.
"""

from __future__ import annotations

from collections import Counter

from .facts import _Facts, _new, _norm


def _rule_protected(fb: _Facts, fa: _Facts, regions, target):
    for region in regions:
        why = f" ({region.reason})" if region.reason else ""
        for sym in region.symbols:
            if sym not in fb.symbols:
                continue
            (b_text, _), = fb.symbols[sym][:1]
            got = fa.symbols.get(sym)
            if not got:
                yield "protected_symbol", 0, f"protected {sym} removed{why}"
                continue
            if len(got) > len(fb.symbols[sym]):
                yield "protected_symbol", got[-1][1], f"protected {sym} is defined again (shadowed){why}"
            a_text, a_line = got[0]
            if a_text != b_text:
                if _norm(a_text) == _norm(b_text):
                    yield "protected_symbol_format", a_line, f"protected {sym}: only comments/formatting changed"
                else:
                    yield "protected_symbol", a_line, f"protected {sym} changed{why}"
            top = sym.split(".")[0]
            if "." not in sym:
                nb, na = fb.bindings.get(top, []), fa.bindings.get(top, [])
                if Counter(t for t, _ in na) - Counter(t for t, _ in nb):
                    line = next((ln for t, ln in na if t not in {x for x, _ in nb}), 0)
                    yield "protected_symbol", line, f"protected {sym} is rebound{why}"
            # its fields may not be overwritten afterwards
            for field_ in fb.class_fields.get(sym, set()):
                nb = Counter((d, f) for d, f, _ in fb.attr_assigns if f == field_)
                for d, f_, line in fa.attr_assigns:
                    if f_ == field_ and nb[(d, f_)] <= 0:
                        yield "protected_field", line, f"{d} overwrites field {field_!r} of protected {sym}{why}"
                    elif f_ == field_:
                        nb[(d, f_)] -= 1
            fields_ = fb.class_fields.get(sym, set())
            if fields_:
                cb = Counter(c.text for c in fb.calls if c.name in ("replace", sym.split(".")[-1]))
                for c in fa.calls:
                    if c.name in ("replace", sym.split(".")[-1]) and cb[c.text] <= 0 and \
                            any(f"keyword='{f_}'" in c.text for f_ in fields_):
                        yield "protected_field", c.line, f"{c.name}(...) sets fields of protected {sym}{why}"
                    elif c.name in ("replace", sym.split(".")[-1]):
                        cb[c.text] -= 1
            # calls to it keep their arguments
            short = sym.split(".")[-1]
            cb = Counter(c.text for c in fb.calls if c.name == short)
            ca = Counter(c.text for c in fa.calls if c.name == short)
            for text, _n in _new(cb, ca):
                line = next(c.line for c in fa.calls if c.name == short and c.text == text)
                yield "protected_call", line, f"a call to protected {sym} has new arguments{why}"
        for name in region.names:
            nb = Counter(t for t, _ in fb.bindings.get(name, []))
            na = Counter(t for t, _ in fa.bindings.get(name, []))
            if nb != na:
                added = na - nb
                line = next((ln for t, ln in fa.bindings.get(name, []) if t in added), 0)
                what = "new or changed assignment" if added else "assignment removed"
                yield "protected_name", line, f"{what} to protected name {name!r}{why}"
            if any(d.endswith(f".{name}") or f == name for d, f, _ in fa.attr_assigns
                   if (d, f) not in {(x, y) for x, y, _ in fb.attr_assigns} and (d.startswith(("setattr(", "globals")))):
                yield "protected_name", 0, f"protected name {name!r} written through setattr/globals(){why}"
