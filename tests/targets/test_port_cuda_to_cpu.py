"""The naive port maps a GPU program to the cpu target, and says what it changed."""

import subprocess
import sys
import textwrap

from trainbridge.targets.port_source import port_naive, port_program

GPU_PROGRAM = textwrap.dedent('''
    import os
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    device = f"cuda:{rank}"
    model = torch.nn.Linear(4, 4).cuda()
    model = torch.compile(model)
    x = torch.randn(2, 4, device="cuda", pin_memory=True)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend="nccl")
    torch.cuda.set_device(0)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        y = model(x.to(device))
    torch.cuda.synchronize()
    print("peak", torch.cuda.max_memory_allocated() // 2**20, y.dtype, y.device)

    @torch.compile
    def f(t):
        return t * 2
    print(f(torch.ones(1, device=device)).device)
''')


def test_cpu_port_runs_and_lists_its_changes(tmp_path):
    result = port_program({"train.py": GPU_PROGRAM}, "cpu")
    kinds = {c.kind for c in result.changes}
    assert {"device", "cuda_api", "memory_stat", "backend", "pin_memory", "compile_removed", "precision_lost"} <= kinds
    src = result.files["train.py"]
    assert "cuda" not in src.replace('device_type="cuda"', "")  # only autocast keeps it, as naive ports do
    assert "torch.compile" not in src and '"gloo"' in src
    (tmp_path / "train.py").write_text(src)
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # autocast(device_type="cuda") does nothing on CPU tensors: the port computes in fp32
    assert "torch.float32 cpu" in out.stdout
    lost = [c for c in result.changes if c.kind == "precision_lost"]
    autocast_line = 1 + next(i for i, l in enumerate(GPU_PROGRAM.splitlines()) if "autocast" in l)
    assert [c.line for c in lost] == [autocast_line]


def test_npu_port_maps_to_torch_npu_and_hccl():
    result = port_program({"train.py": GPU_PROGRAM}, "npu")
    src = result.files["train.py"]
    assert "import torch_npu" in src and '"hccl"' in src and "torch.npu.synchronize()" in src
    assert 'device_type="npu"' in src and '"npu"' in src


def test_gpu_only_features_are_reported_with_lines():
    prog = "import torch\nimport triton\nfrom torch.nn.attention.flex_attention import flex_attention\n" \
           "y = torch._scaled_mm(a, b)\n"
    result = port_naive({"m.py": prog}, "cpu")  # reported by the naive port; targets/features replace them
    found = {(c.line, c.note.split(":")[0]) for c in result.gpu_only}
    lines = {line for line, _ in found}
    assert {2, 3, 4} <= lines
    assert all(c.semantic_change for c in result.gpu_only)


def test_cuda_target_is_unchanged():
    assert port_program({"train.py": GPU_PROGRAM}, "cuda").files["train.py"] == GPU_PROGRAM
