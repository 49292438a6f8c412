"""A custom autograd.Function whose backward returns too few gradients runs compiled, not eager:
the port pads the returns so the eager port trains."""

import torch

from trainbridge.targets.port_source import port_program

SRC = '''import torch


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias_scale, extra=1.0, more=2.0):
        ctx.save_for_backward(w)
        return x * w


    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad * w, None, None
'''


def test_short_backward_returns_are_padded_and_train():
    ns = {}
    exec(SRC, ns)
    x = torch.ones(3, requires_grad=True)
    try:
        ns["Scale"].apply(x, torch.tensor(2.0), 1.0, 3.0).sum().backward()
        raise AssertionError("eager autograd accepted 3 gradients for 4 inputs")
    except RuntimeError as e:
        assert "incorrect number of gradients" in str(e)
    r = port_program({"m.py": SRC}, "cpu")
    assert "return grad * w, None, None, None, None" in r.files["m.py"]
    (c,) = [c for c in r.changes if c.kind == "eager_autograd"]
    assert "3 gradients for 5 forward inputs" in c.note
    ns = {}
    exec(r.files["m.py"], ns)
    x = torch.ones(3, requires_grad=True)
    ns["Scale"].apply(x, torch.tensor(2.0), 1.0, 3.0).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert port_program({"m.py": SRC}, "cuda").files["m.py"] == SRC
