"""Search-and-replace edits as the LLM rewriter applies them."""

from __future__ import annotations

import pytest

from trainbridge.agent.rewriters.edits import Edit, EditError, apply_edits

SRC = '''\
import torch


class Norm(torch.nn.Module):
    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + 1e-6)


def twice(x):
    y = x + 1
    y = x + 1
    return y
'''
F = {"m.py": SRC, "notes.txt": "hello\n"}


def test_exact_unique_match():
    out, changed = apply_edits(F, [Edit(file="m.py", search="        return x * torch.rsqrt(v + 1e-6)\n",
                                        replace="        return x * (v + 1e-6).rsqrt()\n")])
    assert changed == ["m.py"] and "(v + 1e-6).rsqrt()" in out["m.py"] and out["notes.txt"] == F["notes.txt"]
    assert out["m.py"] == SRC.replace("torch.rsqrt(v + 1e-6)", "(v + 1e-6).rsqrt()")


def test_ambiguous_exact_match_names_count_and_file():
    with pytest.raises(EditError, match=r"edit 1 of 1 on m.py: search text occurs 2 times") as e:
        apply_edits(F, [Edit(file="m.py", search="    y = x + 1\n", replace="    y = x + 2\n")])
    assert "|     y = x + 1" in str(e.value)


def test_whitespace_tolerant_unique_match_is_reindented():
    # the model lost the indentation and squeezed spaces
    search = "v = x.pow(2).mean(-1,  keepdim=True)\nreturn x * torch.rsqrt(v + 1e-6)"
    replace = "return torch.nn.functional.rms_norm(x, (x.size(-1),), None, 1e-6)"
    out, _ = apply_edits(F, [Edit(file="m.py", search=search, replace=replace)])
    assert "        return torch.nn.functional.rms_norm(x, (x.size(-1),), None, 1e-6)\n" in out["m.py"]
    assert "pow(2)" not in out["m.py"]
    compile(out["m.py"], "m.py", "exec")


def test_whitespace_tolerant_match_must_be_unique():
    with pytest.raises(EditError, match="matches 2 places when whitespace is ignored"):
        apply_edits(F, [Edit(file="m.py", search="y = x  +  1", replace="y = x + 2")])


def test_not_found_names_file_first_lines_and_nearest_line():
    search = "        return x * torch.rsqrt(v + 1e-5)\n        # more\n        # and more\n        # and yet more\n"
    with pytest.raises(EditError) as e:
        apply_edits(F, [Edit(file="m.py", search=search, replace="pass\n")])
    msg = str(e.value)
    assert msg.startswith("edit 1 of 1 on m.py: search text not found")
    assert "nearest line of the file is line 7" in msg
    assert "|         return x * torch.rsqrt(v + 1e-5)" in msg and "(1 more line(s))" in msg


def test_unknown_file_and_empty_search_and_no_op():
    with pytest.raises(EditError, match=r"file 'other.py' is not part of the program \(files: m.py, notes.txt\)"):
        apply_edits(F, [Edit(file="other.py", search="a", replace="b")])
    with pytest.raises(EditError, match="empty search text"):
        apply_edits(F, [Edit(file="m.py", search="  \n", replace="b")])
    with pytest.raises(EditError, match="change nothing"):
        apply_edits(F, [Edit(file="m.py", search="def twice(x):", replace="def twice(x):")])
    with pytest.raises(EditError, match="no edits"):
        apply_edits(F, [])


def test_result_must_compile():
    with pytest.raises(EditError, match=r"after the edits m.py does not compile: .* line 11"):
        apply_edits(F, [Edit(file="m.py", search="def twice(x):\n    y = x + 1\n", replace="def twice(x):\n    y = (x + 1\n")])


def test_edits_apply_in_order_to_the_edited_text():
    edits = [Edit(file="m.py", search="def twice(x):\n    y = x + 1\n", replace="def twice(x):\n    z = x + 1\n"),
             Edit(file="m.py", search="    y = x + 1\n", replace="    y = z * 2\n"),
             Edit(file="notes.txt", search="hello", replace="bye")]
    out, changed = apply_edits(F, edits)
    assert changed == ["m.py", "notes.txt"]
    assert "    z = x + 1\n    y = z * 2\n    return y\n" in out["m.py"] and out["notes.txt"] == "bye\n"
    assert F["m.py"] == SRC  # the input is not modified
