"""compile_model: the whole model compiled in place, found in the forms programs build it (a class
in another file, a program-defined base class, `.to(device)` chains, module-level scripts),
left alone where the program compiles it already, and reapplied where the port removed the
program's own torch.compile. The rewritten program runs: same loss, same parameter names."""

import textwrap

import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable
from trainbridge.agent.rewriters.recipes_compile_model import root_classes
from trainbridge.targets.port_source import port_program

RECIPE = RECIPES["compile_model"]

MODEL = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Base(nn.Module):
        def count(self):
            return sum(p.numel() for p in self.parameters())


    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = nn.Linear(d, d)

        def forward(self, x):
            return x + torch.tanh(self.fc(x)) * 0.5


    class Net(Base):
        def __init__(self, d=8, depth=2):
            super().__init__()
            self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])
            self.head = nn.Linear(d, 1)

        def forward(self, x, y):
            return ((self.head(self.blocks(x)).squeeze(-1) - y) ** 2).mean()
""")

TRAIN = textwrap.dedent("""
    import torch
    from model import Net


    def main(steps=3):
        torch.manual_seed(0)
        device = "cpu"
        model = Net(8).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(steps):
            x, y = torch.randn(16, 8, generator=g), torch.randn(16, generator=g)
            loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return model, losses


    if __name__ == "__main__":
        main()
""")


def test_the_root_is_the_module_no_other_module_builds_through_program_defined_bases():
    assert root_classes({"model.py": MODEL, "train.py": TRAIN}) == {"Net"}


def test_the_model_built_in_another_file_is_compiled_in_place_after_its_line():
    files = {"model.py": MODEL, "train.py": TRAIN}
    sites = RECIPE.find(files, "cpu")
    assert [(s.file, s.qualname, s.detail["model"], s.detail["class"]) for s in sites] == \
        [("train.py", "main", "model", "Net")]
    p = RECIPE.apply(files, "cpu")
    assert not isinstance(p, NotApplicable), p
    assert p.changed_files == ["train.py"]
    lines = p.files["train.py"].splitlines()
    at = lines.index("    model = Net(8).to(device)")
    assert lines[at + 1].startswith("    model.compile(dynamic=False)")


def test_the_compiled_program_trains_as_the_eager_one_with_the_same_parameter_names(tmp_path, monkeypatch):
    files = {"model.py": MODEL, "train.py": TRAIN}
    new = RECIPE.apply(files, "cpu").files
    results = {}
    for label, srcs in (("eager", files), ("compiled", new)):
        d = tmp_path / label
        d.mkdir()
        for rel, text in srcs.items():
            (d / rel).write_text(text)
        monkeypatch.syspath_prepend(str(d))
        ns = {"__name__": f"prog_{label}"}
        exec(compile(srcs["train.py"], str(d / "train.py"), "exec"), ns)
        results[label] = ns["main"]()
        monkeypatch.delitem(__import__("sys").modules, "model")
    (eager, eager_losses), (compiled, compiled_losses) = results["eager"], results["compiled"]
    assert compiled._compiled_call_impl is not None and eager._compiled_call_impl is None
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no `_orig_mod.` prefix
    assert torch.allclose(torch.tensor(compiled_losses), torch.tensor(eager_losses), rtol=1e-5, atol=1e-6)


def test_a_model_the_program_compiles_already_is_left_alone():
    train = TRAIN.replace("    opt = torch.optim", "    model = torch.compile(model)\n    opt = torch.optim")
    got = RECIPE.apply({"model.py": MODEL, "train.py": train}, "cpu")
    assert isinstance(got, NotApplicable) and "compiles it already" in got.reason


def test_modules_built_inside_classes_and_attribute_targets_are_not_sites():
    script = MODEL + textwrap.dedent("""

        class Trainer:
            def __init__(self):
                self.model = Net()
    """)
    assert RECIPE.find({"model.py": script}, "cpu") == []


def test_a_module_level_script_is_a_site():
    script = MODEL + "\nmodel = Net(4, depth=1)\nloss = model(torch.randn(2, 4), torch.randn(2))\n"
    sites = RECIPE.find({"train.py": script}, "cpu")
    assert [(s.qualname, s.detail["model"]) for s in sites] == [("<module>", "model")]


def test_the_port_removes_the_programs_compile_and_the_recipe_puts_it_back():
    """The GPU program compiled its model; the naive cpu port runs eager; compile_model reapplies."""
    train = TRAIN.replace('device = "cpu"', 'device = "cuda"').replace(
        "    opt = torch.optim", "    model = torch.compile(model)\n    opt = torch.optim")
    ported = port_program({"model.py": MODEL, "train.py": train}, "cpu").files
    assert "torch.compile" not in ported["train.py"]
    p = RECIPE.apply(ported, "cpu")
    assert not isinstance(p, NotApplicable), p
    assert "model.compile(dynamic=False)" in p.files["train.py"]


def test_an_annotated_assignment_builds_the_model_too():
    """The current Modded-NanoGPT record writes `model: nn.Module = GPT(...)`."""
    train = TRAIN.replace("    model = Net(8).to(device)", "    model: torch.nn.Module = Net(8).to(device)")
    p = RECIPE.apply({"model.py": MODEL, "train.py": train}, "cpu")
    assert not isinstance(p, NotApplicable), p
    lines = p.files["train.py"].splitlines()
    at = lines.index("    model: torch.nn.Module = Net(8).to(device)")
    assert lines[at + 1].startswith("    model.compile(dynamic=False)")
