"""The naive port as a source transformation: every idiom, its PortChange, and runs on cpu."""

import subprocess
import sys
import textwrap

import pytest

from trainbridge.targets.port_source import port_naive, port_program

from tests.kits import recipe_testkit as kit

IDIOMS = kit.read("port_idioms.py")
GPU_ONLY = kit.read("gpu_only.py")
NANO = kit.nanogpt_source()


def _lines(src, needle):
    return [i + 1 for i, line in enumerate(src.splitlines()) if needle in line]


def test_cpu_port_maps_every_idiom_and_records_it():
    r = port_program({"p.py": IDIOMS}, "cpu")
    src = r.files["p.py"]
    by_kind = {}
    for c in r.changes:
        by_kind.setdefault(c.kind, []).append(c)
    assert {"device", "cuda_api", "memory_stat", "backend", "pin_memory", "compile_removed", "precision_lost"} <= set(by_kind)
    assert 'device = "cpu"' in src and 'torch.device("cpu")' in src and '"gloo"' in src
    assert "torch.cpu.set_device(rank)" in src and "torch.cpu.synchronize()" in src and "torch.cpu.Event()" in src
    assert "pinned = False" in src and "reset_peak_memory_stats" not in src
    assert "pin_memory" not in src and "x = x.to(device, non_blocking=True)" in src
    assert 'y = y.to("cpu", non_blocking=True)' in src and '.to("cpu")' in src
    assert "model = model\n" in src and "torch.compile" not in src and "@" not in src.replace("@torch", "")
    assert "torch.cuda.max_memory_allocated()" not in src and "print(\"mem\", 0 // 2**20, 0," in src
    # autocast keeps its device type, like the public ports: recorded, not rewritten
    assert 'torch.autocast(device_type="cuda", dtype=torch.bfloat16)' in src
    (lost,) = by_kind["precision_lost"]
    assert lost.line == _lines(IDIOMS, "torch.autocast")[0] and lost.before == lost.after and lost.semantic_change
    assert all(c.semantic_change is False for c in by_kind["compile_removed"])
    assert {c.line for c in by_kind["compile_removed"]} == set(_lines(IDIOMS, "torch.compile"))
    assert any("peak RSS" in c.note for c in by_kind["memory_stat"])


def test_cpu_port_runs(tmp_path):
    r = port_program({"p.py": IDIOMS}, "cpu")
    (tmp_path / "p.py").write_text(r.files["p.py"])
    out = subprocess.run([sys.executable, "p.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "out torch.float32 cpu dev0 cpu pinned False" in out.stdout  # cuda autocast is a no-op on cpu tensors
    assert "fn 2.0 1.0" in out.stdout and "mem 0 0 1" in out.stdout


def test_npu_port():
    r = port_program({"p.py": IDIOMS}, "npu")
    src = r.files["p.py"]
    assert src.index("import torch_npu") > src.index("import torch\n")
    assert 'device = f"npu:{rank}"' in src and 'torch.device("npu", rank)' in src and '"hccl"' in src
    assert "torch.npu.set_device(rank)" in src and "torch.npu.max_memory_allocated()" in src
    assert 'torch.autocast(device_type="npu", dtype=torch.bfloat16)' in src  # as transfer_to_npu does
    assert 'y.to("npu", non_blocking=True)' in src and "torch.compile" not in src and "pin_memory" not in src
    assert not [c for c in r.changes if c.kind == "precision_lost"]


def test_gpu_only_features_are_reported_not_rewritten():
    r = port_naive({"g.py": GPU_ONLY}, "cpu")
    # the SM count is the one GPU query the naive port answers itself (it only sizes kernel grids)
    sm_line = _lines(GPU_ONLY, "multi_processor_count")[0]
    assert r.files["g.py"].splitlines()[sm_line - 1] == \
        GPU_ONLY.splitlines()[sm_line - 1].replace('torch.cuda.get_device_properties(0).multi_processor_count',
                                                   "torch.get_num_threads()")
    assert [c.kind for c in r.changes if c.line == sm_line] == ["cuda_api"]
    assert r.files["g.py"].replace("torch.get_num_threads()", "torch.cuda.get_device_properties(0).multi_processor_count") \
        == GPU_ONLY
    found = {c.line for c in r.gpu_only}
    for needle in ("import triton\n", "import triton.language", "flex_attention import", "flash_attn_interface",
                   "@triton.jit", "_scaled_mm", "create_block_mask(mask_mod",
                   "return flex_attention", "return flash_attn_varlen_func"):
        line = _lines(GPU_ONLY, needle.strip("\n"))[0]
        assert line in found, (needle, line, sorted(found))
    assert all(c.semantic_change and c.before == c.after for c in r.gpu_only)
    notes = " ".join(c.note for c in r.gpu_only)
    assert "FP8" in notes and "FlexAttention" in notes and "FlashAttention-3" in notes and "Triton" in notes
    assert port_naive({"g.py": GPU_ONLY}, "cuda").changes == []


def test_cuda_target_is_identity():
    r = port_program({"p.py": IDIOMS, "notes.txt": "cuda"}, "cuda")
    assert r.files == {"p.py": IDIOMS, "notes.txt": "cuda"} and r.changes == []


@pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")
def test_nanogpt_cpu_port_imports_builds_and_steps(tmp_path):
    r = port_program({"train_gpt.py": NANO}, "cpu")
    kinds = {c.kind for c in r.changes}
    assert {"device", "cuda_api", "memory_stat", "backend", "precision_lost"} <= kinds
    assert "pin_memory" in kinds or "pin_memory" not in NANO
    (tmp_path / "train_gpt.py").write_text(r.files["train_gpt.py"])
    probe = textwrap.dedent("""
        import runpy, torch
        ns = runpy.run_path("train_gpt.py", run_name="ported")
        model = ns["GPT"](vocab_size=64, n_layer=2, n_head=2, n_embd=32, max_seq_len=16)
        idx = torch.randint(0, 64, (2, 16))
        loss = model(idx, idx)
        loss.backward()
        print("ok", loss.dtype, loss.device)
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok torch.float32 cpu" in out.stdout


def test_the_compiled_modules_original_is_the_module_itself_once_compile_is_removed():
    """records 84+: `quantize_weights_fp8(model._orig_mod)` after `model = torch.compile(model)`."""
    src = textwrap.dedent('''
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        model = torch.compile(model, dynamic=False)
        raw = model._orig_mod
        raw.weight.data.zero_()
        print("zeroed", float(model.weight.abs().sum()))
    ''')
    r = port_program({"p.py": src}, "cpu")
    out = r.files["p.py"]
    assert "_orig_mod" not in out and "raw = model\n" in out
    assert any(c.kind == "compile_removed" and c.before == "model._orig_mod" for c in r.changes)
    ns: dict = {}
    exec(compile(out, "p.py", "exec"), ns)
    assert ns["raw"] is ns["model"]
    assert port_program({"p.py": src}, "cuda").files["p.py"] == src
