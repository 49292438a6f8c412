"""The scale override on small programs of our own, one per hyperparameter layout the records
used: dataclass fields, a plain class, argparse, module constants, batch-size / window /
stage schedules, heads derived from the width, layer-indexed model code. Each test checks the
values written, where they were written, the static check of the scaled section, and the
problems reported when a knob cannot be made consistent."""

from __future__ import annotations

import ast

import pytest

from trainbridge.records.scale import CPU_DEFAULTS, KNOBS, scale_record, scale_script

# records 4-11 style: dataclass GPTConfig + Hyperparameters in sequences, asserts at module level
DATACLASS = '''
import os
from dataclasses import dataclass
import torch
import torch.nn as nn

@dataclass
class GPTConfig:
    vocab_size : int = 50304
    n_layer : int = 12
    n_head : int = 6
    n_embd : int = 768

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.skip_weights = nn.Parameter(torch.ones(config.n_layer // 2))

@dataclass
class Hyperparameters:
    input_bin : str = 'data/fineweb10B/fineweb_train_*.bin'
    input_val_bin : str = 'data/fineweb10B/fineweb_val_*.bin'
    batch_size : int = 8*64  # sequences, all devices
    device_batch_size : int = 64
    sequence_length : int = 1024
    num_iterations : int = 3000
    warmup_iters : int = 0
    warmdown_iters : int = 900
    val_loss_every : int = 125
    val_tokens : int = 10485760

args = Hyperparameters()
ddp_world_size = int(os.environ['WORLD_SIZE'])
B, T = args.device_batch_size, args.sequence_length
assert args.val_tokens % (B * T * ddp_world_size) == 0
val_steps = args.val_tokens // (B * T * ddp_world_size)
assert args.batch_size % (B * ddp_world_size) == 0
train_accumulation_steps = args.batch_size // (B * ddp_world_size)
num_vocab = 50304
model = GPT(GPTConfig(vocab_size=num_vocab, n_layer=12, n_head=6, n_embd=768)).cuda()

def get_lr(it):
    assert it <= args.num_iterations
    if it < args.warmup_iters:
        return (it + 1) / args.warmup_iters
    elif it < args.num_iterations - args.warmdown_iters:
        return 1.0
    return (args.num_iterations - it) / args.warmdown_iters
'''


def test_dataclass_layout_sequences_and_step_counts():
    r = scale_record(DATACLASS, shards="/data/shards")
    hp = r.hyperparameters
    assert (hp["batch_size"], hp["device_batch_size"], hp["sequence_length"]) == (1, 1, 1024), \
        "batch_size counts sequences here: one 1024-token sequence per step"
    assert hp["num_iterations"] == 300 and hp["warmdown_iters"] == 90, "warm-down keeps its 30% of the run"
    assert hp["val_loss_every"] == 0 and hp["val_tokens"] == 2048
    assert hp["input_bin"] == "/data/shards/train_*.bin" and hp["input_val_bin"] == "/data/shards/val_*.bin"
    assert r.applied["n_layer"] == ["GPTConfig.n_layer", f"call GPTConfig(n_layer=) line {_line(DATACLASS, 'model = GPT')}"]
    assert r.model == {"vocab_size": 50304, "num_layers": 4, "num_heads": 2, "model_dim": 128}
    assert r.asserts_checked == 2, "the two module asserts"
    assert r.invariants_checked >= 5, "get_lr was run at every step (its own assert inside)"
    assert r.problems == [] and r.unmatched == []
    assert r.tokens_per_step == r.tokens_at_start == 1024 and r.train_tokens_needed() == 300 * 1024 + 1
    assert "vocab_size : int = 50304" in r.source, "the vocabulary stays: the shards carry GPT-2 ids"
    ast.parse(r.source)


def test_dataclass_layout_reports_what_breaks_the_records_asserts():
    r = scale_record(DATACLASS, {"val_tokens": 1000, "warmdown_iters": 5000})
    assert any("val_tokens % (B * T * ddp_world_size) == 0" in p for p in r.problems), r.problems
    assert any("warmdown_iters = 5000 exceeds" in p for p in r.problems), r.problems
    r = scale_record(DATACLASS, {"width": 100, "heads": 3})
    assert any("model_dim 100 is not a multiple of num_heads 3" in p for p in r.problems), r.problems


def _line(src: str, text: str) -> int:
    return next(i for i, line in enumerate(src.splitlines(), 1) if line.startswith(text))


# records 18-28 style: a plain class in tokens, FlexAttention blocks, layer-indexed model code,
# a fixed head_dim default, the model constructor's keywords
PLAIN_CLASS = '''
import torch
from torch import nn

BLOCK_SIZE = 128

class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_seq_len: int, head_dim=128):
        super().__init__()
        hdim = num_heads * head_dim

class Block(nn.Module):
    def __init__(self, dim, num_heads, max_seq_len, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(dim, num_heads, max_seq_len) if layer_idx != 7 else None

class GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, num_heads, model_dim, max_seq_len):
        super().__init__()
        assert num_layers % 2 == 0
        self.blocks = nn.ModuleList([Block(model_dim, num_heads, max_seq_len, i) for i in range(num_layers)])

    def forward(self, input_seq, ve):
        assert len(input_seq) % BLOCK_SIZE == 0
        ve = [ve[0], ve[1], ve[2]] + [None] * (len(self.blocks) - 6) + [ve[0], ve[1], ve[2]]
        return ve

class Hyperparameters:
    train_files = "data/fineweb10B/fineweb_train_*.bin"
    val_files = "data/fineweb10B/fineweb_val_*.bin"
    val_tokens = 10485760
    seq_len = 48*1024
    val_seq_len = 4*64*1024
    num_iterations = 1770
    cooldown_frac = 0.4
    val_loss_every = 125
args = Hyperparameters()
world_size = 8
model = GPT(vocab_size=50257, num_layers=12, num_heads=6, model_dim=768,
            max_seq_len=max(args.seq_len, args.val_seq_len)).cuda()
for step in range(args.num_iterations + 1):
    if step == args.num_iterations:
        val_batch_size = world_size * args.val_seq_len
        assert args.val_tokens % val_batch_size == 0
'''


def test_plain_class_layout_keeps_the_layer_count_the_model_code_names():
    r = scale_record(PLAIN_CLASS)
    assert r.config["layers"] == 12 and any("layers kept at the record's 12" in n and "layer_idx != 7" in n
                                            for n in r.notes), r.notes
    assert r.config["head_dim"] == 128 and r.model["model_dim"] == 256, "2 heads of the fixed head_dim 128"
    hp = r.hyperparameters
    assert (hp["seq_len"], hp["val_seq_len"], hp["num_iterations"], hp["val_tokens"]) == (1024, 1024, 300, 2048)
    assert r.model["max_seq_len"] == 1024 and r.problems == []
    assert "Hyperparameters.seq_len" in r.applied["seq_len"], "plain class attributes are fields too"
    assert r.asserts_checked >= 1, "the training loop's val_tokens assert was evaluated"


def test_plain_class_layout_problems_name_the_construct():
    r = scale_record(PLAIN_CLASS, {"layers": 4, "seq": 100})
    assert any("layers=4 asked for" in p and "layer_idx != 7" in p for p in r.problems), r.problems
    assert any("args.seq_len = 100: FlexAttention sequences are whole 128-token blocks" in p for p in r.problems)
    r = scale_record(PLAIN_CLASS, {"layers": 5})
    assert any("even layer count" in p for p in r.problems), r.problems


ARGPARSE = '''
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--num_layers", type=int, default=12)
parser.add_argument("--num_heads", type=int, default=6)
parser.add_argument("--model_dim", type=int, default=768)
parser.add_argument("--batch-size", type=int, default=64, help="sequences per step")
parser.add_argument("--sequence_length", type=int, default=1024)
parser.add_argument("--num_iterations", type=int, default=5100)
parser.add_argument("--warmdown_iters", type=int, default=1450)
parser.add_argument("--input_bin", type=str, default="data/train_*.bin")
parser.add_argument("--lr", type=float, default=0.0036)
args = parser.parse_args()
assert args.model_dim % args.num_heads == 0
'''


def test_argparse_layout():
    r = scale_record(ARGPARSE, {"steps": 100}, shards="/s")
    hp = r.hyperparameters
    assert (hp["num_layers"], hp["num_heads"], hp["model_dim"]) == (4, 2, 128)
    assert (hp["batch_size"], hp["sequence_length"], hp["num_iterations"], hp["warmdown_iters"]) == (1, 1024, 100, 28)
    assert hp["input_bin"] == "/s/train_*.bin" and hp["lr"] == 0.0036
    line = _line(ARGPARSE, 'parser.add_argument("--batch-size')
    assert r.applied["batch_size"] == [f"argparse --batch_size default line {line}"]
    assert r.asserts_checked == 1 and r.problems == []


MODULE_CONSTANTS = '''
import os
world_size = int(os.environ["WORLD_SIZE"])
assert 8 % world_size == 0, "world_size must be a divisor of 8"
grad_accum_steps = 8 // world_size
num_layers = 12
num_heads = 6
model_dim = 768
train_batch_size = 2048 * 24 * 8
val_batch_size = 4 * 64 * 1024 * 8
num_iterations = 1670
val_tokens = 10485760
NORMUON_NOISE_WARMUP = 50
assert val_tokens % val_batch_size == 0
assert train_batch_size % (world_size * grad_accum_steps) == 0
'''


def test_module_constants_layout_and_grad_accumulation():
    r = scale_record(MODULE_CONSTANTS)
    hp = r.settings
    assert hp[f"module constant grad_accum_steps line {_line(MODULE_CONSTANTS, 'grad_accum_steps')}"] == 1, \
        "one process, one micro-step: the expression 8 // world_size is replaced"
    values = {w.split()[2]: v for w, v in hp.items() if w.startswith("module constant")}
    assert values["train_batch_size"] == 1024 and values["val_batch_size"] == 1024 and values["val_tokens"] == 2048
    assert values["num_layers"] == 4 and values["model_dim"] == 128 and values["num_iterations"] == 300
    assert values["NORMUON_NOISE_WARMUP"] == 9, "a step count scaled with the run (50 x 300/1670)"
    assert r.asserts_checked == 3 and r.problems == []
    r = scale_record(MODULE_CONSTANTS, {"grad_accum": 3})
    assert r.tokens_per_step == 3072 and r.problems == [], "3 micro-steps of 1024 tokens, batch sizes to match"


# records 46-71 and 72 on: batch-size and window schedules, scheduled + extension steps,
# per-stage keywords, a schedule object with its own assert, varlen attention, head_dim keyword
SCHEDULES = '''
import torch
from torch import nn
from dataclasses import dataclass
from itertools import accumulate, pairwise

class CausalSelfAttention(nn.Module):
    def __init__(self, dim, head_dim, num_heads):
        super().__init__()
        self.hdim = num_heads * head_dim
        assert self.hdim == dim, "num_heads * head_dim must equal model_dim"

    def forward(self, x):
        B, T = x.size(0), x.size(1)
        assert T % 16 == 0

@dataclass
class Hyperparameters:
    train_files: str = "data/fineweb10B/fineweb_train_*.bin"
    val_files: str = "data/fineweb10B/fineweb_val_*.bin"
    val_tokens: int = 10485760
    train_bs_schedule: tuple = (8 * 2048 * 8, 16 * 2048 * 8, 24 * 2048 * 8)
    train_bs_extension: int = 24 * 2048 * 8
    train_max_seq_len: int = 128 * 16
    val_batch_size: int = 4 * 64 * 1024 * 8
    num_scheduled_iterations: int = 2120
    num_extension_iterations: int = 40
    num_iterations: int = num_scheduled_iterations + num_extension_iterations
    cooldown_frac: float = 0.55
    transition_steps: int = 40
    val_loss_every: int = 250
    block_size: int = 128
    ws_schedule: tuple = (3, 7, 11)
    ws_final: int = 13

args = Hyperparameters()
world_size = 8
grad_accum_steps = 8 // world_size

@dataclass
class TrainingStage:
    batch_size: int
    window_sizes: tuple
    train_max_seq_len: int
    mtp_weights: list
    duration: float = None

class TrainingSchedule:
    def __init__(self, stages, scheduled_iterations, extension_iterations):
        self.stages = stages
        self.total_steps = scheduled_iterations + extension_iterations
        ends = [0, *[round(c * scheduled_iterations) for c in accumulate(s.duration for s in stages[:-1])],
                self.total_steps]
        assert scheduled_iterations == ends[-2]
        self.boundaries = list(pairwise(ends))

    def lookup(self, step):
        for i, (start, end) in enumerate(self.boundaries):
            if step < end:
                return self.stages[i], (step - start) / (end - start)
        return self.stages[-1], 1.0

TRAINING_STAGES = [
    TrainingStage(duration=1/3, train_max_seq_len=896, batch_size=8 * 2048 * 8, window_sizes=(1, 3), mtp_weights=[1.0, 0.5]),
    TrainingStage(duration=1/3, train_max_seq_len=2048, batch_size=16 * 2048 * 8, window_sizes=(3, 7), mtp_weights=[1.0]),
    TrainingStage(duration=1/3, train_max_seq_len=2048, batch_size=24 * 2048 * 8, window_sizes=(5, 11), mtp_weights=[1.0]),
    TrainingStage(train_max_seq_len=2048, batch_size=24 * 2048 * 8, window_sizes=(6, 13), mtp_weights=[1.0]),
]
training_schedule = TrainingSchedule(TRAINING_STAGES, args.num_scheduled_iterations, args.num_extension_iterations)
mtp_table = [1.0] * 2200  # a per-step table sized for the record's own run

def get_ws(step: int):
    x = min(step / args.num_scheduled_iterations, 0.9999)
    return args.ws_schedule[int(len(args.ws_schedule) * x)]

def get_bs(step: int):
    x = min(step / args.num_scheduled_iterations, 0.9999)
    return args.train_bs_schedule[int(len(args.train_bs_schedule) * x)]

def get_mtp(step: int):
    return mtp_table[step]

def get_muon_momentum(step: int, muon_warmup_steps=300, muon_cooldown_steps=50):
    return min(step / muon_warmup_steps, 1.0)

ws_schedule = list(args.ws_schedule) + [args.ws_final]
bs_schedule = list(args.train_bs_schedule) + [args.train_bs_extension]
assert len(ws_schedule) == len(bs_schedule)
model = GPT(vocab_size=50257, num_layers=11, num_heads=6, head_dim=128, model_dim=768,
            max_seq_len=args.val_batch_size // (grad_accum_steps * world_size))
'''


def test_schedules_keep_their_shape_and_the_step_counts_add_up():
    r = scale_record(SCHEDULES)
    hp = r.hyperparameters
    assert hp["train_bs_schedule"] == (384, 640, 1024) and hp["train_bs_extension"] == 1024, "8:16:24, in 128s"
    assert (hp["num_scheduled_iterations"], hp["num_extension_iterations"], hp["num_iterations"]) == (294, 6, 300)
    assert hp["transition_steps"] == 6 and hp["val_batch_size"] == 1024 and hp["train_max_seq_len"] == 1024
    stages = [v for w, v in r.settings.items() if "TrainingStage(batch_size=)" in w]
    assert stages == [384, 640, 1024, 1024]
    seq_lens = [v for w, v in r.settings.items() if "TrainingStage(train_max_seq_len=)" in w]
    assert seq_lens == [896, 1024, 1024, 1024], "a per-document cap never above a step's tokens"
    momentum = {w.split("(")[1].split("=")[0]: v for w, v in r.settings.items() if w.startswith("def get_muon")}
    assert momentum == {"muon_warmup_steps": 42, "muon_cooldown_steps": 7}
    assert r.model == {"vocab_size": 50257, "num_layers": 4, "num_heads": 2, "head_dim": 128, "model_dim": 256,
                       "max_seq_len": 1024}
    assert r.problems == [], r.problems
    assert r.invariants_checked >= 10
    assert (r.tokens_per_step, r.tokens_at_start) == (1024, 384), "a timing run measures the first stage"


def test_schedule_problems_are_found_by_running_the_schedules():
    r = scale_record(SCHEDULES, {"steps": 3000})
    assert any("get_mtp(step=2200)" in p and "IndexError" in p for p in r.problems), r.problems
    r = scale_record(SCHEDULES, {"seq": 1000})
    assert any("T % 16 == 0" in p for p in r.problems), r.problems
    r = scale_record(SCHEDULES, {"head_dim": 64, "width": 256})
    assert any("num_heads * head_dim = 2 * 64 != model_dim 256" in p for p in r.problems), r.problems


HEADS_FROM_WIDTH = '''
from dataclasses import dataclass

@dataclass
class Hyperparameters:
    model_dim: int = 768
    num_heads: int = model_dim // 128
    num_layers: int = 12
    num_iterations: int = 1000
args = Hyperparameters()
'''


def test_heads_derived_from_the_width():
    r = scale_record(HEADS_FROM_WIDTH)
    assert r.hyperparameters["model_dim"] == 256 and r.hyperparameters["num_heads"] == 2, \
        "num_heads = model_dim // 128: the width is chosen so that the derivation gives 2 heads"
    assert any("model_dim // 128" in n for n in r.notes)
    assert "num_heads" not in r.applied, "the derived field is left to follow the width"
    r = scale_record(HEADS_FROM_WIDTH, {"width": 128})
    assert any("gives 1 heads" in p for p in r.problems)


VALUE_EMBEDS = '''
import torch
from torch import nn

class GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, num_heads, model_dim):
        super().__init__()
        self.value_embeds = nn.ModuleList([nn.Embedding(vocab_size, model_dim) for _ in range(3)])

    def forward(self, x):
        ve = [emb(x) for emb in self.value_embeds]
        ve = [ve[0], ve[1], ve[2], None, None, None, None, None, None, ve[0], ve[1], ve[2]]
        return ve

model = GPT(vocab_size=50304, num_layers=12, num_heads=6, model_dim=768)
'''


def test_value_embedding_lists_tied_to_the_layer_count():
    r = scale_record(VALUE_EMBEDS)
    assert r.config["layers"] == 12 and "a per-layer list of 12 entries" in " ".join(r.notes)
    r = scale_record(VALUE_EMBEDS, {"layers": 4})
    assert any("written for 12 layers" in p and "per-layer list of 12 entries" in p for p in r.problems)


def test_knob_table_and_defaults_agree():
    assert set(CPU_DEFAULTS) <= set(KNOBS)
    assert CPU_DEFAULTS["seq"] * CPU_DEFAULTS["batch"] == 1024 and "vocab" not in CPU_DEFAULTS


def test_exact_names_win_and_unknown_names_are_unmatched():
    r = scale_script(DATACLASS, {"layers": 4, "n_layer": 6, "heads": 2, "no_such_field": 1})
    assert r.model["num_layers"] == 6 and r.unmatched == ["no_such_field"]


@pytest.mark.parametrize("src", [DATACLASS, PLAIN_CLASS, ARGPARSE, MODULE_CONSTANTS, SCHEDULES, HEADS_FROM_WIDTH])
def test_every_scaled_program_parses_and_keeps_everything_else(src):
    r = scale_record(src)
    ast.parse(r.source)
    before, after = src.splitlines(), r.source.splitlines()
    assert len(before) == len(after), "values are replaced in place; no line is added or removed"
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) <= sum(len(w) for w in r.applied.values())


def test_the_per_record_table(tmp_path):
    from trainbridge.records.models import RecordEntry, RecordIndex
    from trainbridge.records.scale_report import main, scale_rows, table_md

    index = RecordIndex(source="x", records=[
        RecordEntry(key="2024-10-14_A", num=5, track=1, name="A", script=DATACLASS),
        RecordEntry(key="2025-01-26_B", num=21, track=1, name="B", script=PLAIN_CLASS),
        RecordEntry(key="medium", num=None, track=2, name="M", script=DATACLASS),
    ])
    rows = scale_rows(index)
    assert [r.num for r in rows] == [5, 21], "track 1 only"
    assert (rows[0].layers, rows[0].width, rows[0].problems) == (4, 128, [])
    assert rows[1].layers == 12 and rows[1].head_dim == 128 and "steps" in rows[1].knobs
    text = table_md(rows)
    assert "| 21 | 2025-01-26_B | 12 (kept) | 2 x 128 = 256 | 1024 | 300 |" in text
    assert text.endswith("2 of 2 scripts scale with no problem.")
    (tmp_path / "records.json").write_text(index.model_dump_json())
    assert main([str(tmp_path / "records.json"), "--set", "steps=100", "-o", str(tmp_path / "t.md")]) == 0
    assert "| 5 | 2024-10-14_A | 4 | 2 x 64 = 128 | 1024 | 100 |" in (tmp_path / "t.md").read_text()


# records 16-17: the block mask is built over a hard-coded count of 128-token blocks
HARD_CODED_BLOCKS = '''
from dataclasses import dataclass
import torch

@dataclass
class Hyperparameters:
    sequence_length : int = 64*1024
    num_iterations : int = 1000

class GPT(torch.nn.Module):
    def forward(self, inputs, sliding_window_num_blocks):
        BLOCK_SIZE = 128
        docs = (inputs == 50256).cumsum(0)
        docs_low = docs.view(-1, BLOCK_SIZE)[:, 0]

        def create_doc_swc_block_mask(sliding_window_num_blocks):
            kv_idx = block_idx = torch.arange(512, dtype=torch.int32, device="cuda")
            q_idx = block_idx[:, None]
            return (q_idx >= kv_idx) & (docs_low[:, None] <= docs_low)

        return create_doc_swc_block_mask(sliding_window_num_blocks)

positions = torch.arange(512)  # not a mask: untouched
'''


def test_a_hard_coded_block_count_follows_the_sequence():
    r = scale_script(HARD_CODED_BLOCKS, {"seq": 1024}, run_check=False)
    assert "sequence_length : int = 1024" in r.source
    assert 'torch.arange(8, dtype=torch.int32, device="cuda")' in r.source
    assert "positions = torch.arange(512)" in r.source
    (where,) = r.applied["mask_blocks"]
    assert r.settings[where] == 8 and "torch.arange(512)" in where


KERNEL_WARMUP = '''
import copy
from dataclasses import dataclass
import torch
from torch import nn

@dataclass
class Hyperparameters:
    train_seq_len: int = 48 * 1024
    num_iterations: int = 1750
    warmup_steps: int = 0   # a field of the same name: not the kernel warmup

args = Hyperparameters()
model = nn.Linear(4, 4)
optimizers = [torch.optim.Adam(model.parameters())]
warmup_steps = WARMUP
initial_state = dict(model=copy.deepcopy(model.state_dict()),
                     optimizers=[copy.deepcopy(opt.state_dict()) for opt in optimizers])
for step in STEPS:
    model(torch.randn(2, 4)).sum().backward()
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
model.load_state_dict(initial_state["model"])

def get_lr(step, warmup_steps=10):
    return min(1.0, step / warmup_steps)
'''


@pytest.mark.parametrize("warmup, steps, skipped", [
    ("10", "range(warmup_steps)", "1"),                                             # records 21-53
    ("sorted({0, 1, 2} | set(s + o for s in [5] for o in [-1, 0, 1]))", "warmup_steps", "[0]"),  # 54 on
])
def test_the_gpu_kernel_warmup_is_cut_to_one_step_and_training_steps_are_timed(warmup, steps, skipped):
    """The records run their step N times to compile kernels, then restore the initial state:
    on an eager port those would be the steps the harness times (records 44-46: Adam never
    steps in the warmup, so the port check saw a flat loss and refused a working port). One
    step stays: the optimizers create their buffers in it (records 44-46 zero them after)."""
    src = KERNEL_WARMUP.replace("WARMUP", warmup).replace("STEPS", steps)
    r = scale_script(src, {"seq": 1024}, run_check=False)
    assert f"\nwarmup_steps = {skipped}\n" in r.source
    assert "warmup_steps: int = 0" in r.source and "def get_lr(step, warmup_steps=10)" in r.source
    (where,) = r.applied["kernel_warmup_steps"]
    assert r.settings[where] == skipped
    assert any("kernel warmup cut to one step" in n for n in r.notes)
    ns: dict = {}
    exec(compile(r.source, "scaled.py", "exec"), ns)  # one step, then the state restored
    assert "exp_avg" in ns["optimizers"][0].state_dict()["state"][0], "the warmup step made the buffers"
    # a script without the state restore keeps its loop: it is training, not a warmup
    plain = scale_script(src.replace('model.load_state_dict(initial_state["model"])', "").replace(
        "initial_state = dict(", "saved = dict("), {"seq": 1024}, run_check=False)
    assert "kernel_warmup_steps" not in plain.applied


# record 85: an attention kernel module beside the script, written for 6 heads of 128
DC_KERNELS = '''
import torch

def dc_attention_forward_impl(q, k, v, window):
    B, T, H, D = q.shape
    assert B == 1 and H == 6 and D == 128
    return q
'''


def test_a_kernel_files_asserted_head_size_is_kept():
    six_heads = SCHEDULES.replace('        self.hdim = num_heads * head_dim\n',
                                  '        assert num_heads == 6\n        self.hdim = num_heads * head_dim\n')
    alone = scale_record(six_heads)
    assert (alone.config["heads"], alone.config["head_dim"]) == (6, 32), "6 heads near width 256 without the kernel"
    r = scale_record(six_heads, companions={"dc_triton_kernels.py": DC_KERNELS})
    assert (r.config["heads"], r.config["head_dim"], r.config["width"]) == (6, 128, 768)
    assert r.model["head_dim"] == 128 and r.model["model_dim"] == 768 and r.problems == [], r.problems
    assert any("dc_triton_kernels.py line 6: `D == 128`" in n for n in r.notes), r.notes
    asked = scale_record(six_heads, {"head_dim": 64}, companions={"dc_triton_kernels.py": DC_KERNELS})
    assert any("written for head size 128" in p for p in asked.problems), asked.problems


def test_a_kept_wide_model_shrinks_its_bigram_table():
    six_heads = SCHEDULES.replace('        self.hdim = num_heads * head_dim\n',
                                  '        assert num_heads == 6\n        self.hdim = num_heads * head_dim\n')
    with_table = six_heads.replace("    val_tokens: int = 10485760\n",
                                   "    val_tokens: int = 10485760\n    bigram_vocab_size: int = 50304 * 15 // 2\n")
    narrow = scale_record(with_table)
    assert narrow.config["width"] <= 256 and narrow.hyperparameters["bigram_vocab_size"] == CPU_DEFAULTS["bigram_vocab"]
    wide = scale_record(with_table, companions={"dc_triton_kernels.py": DC_KERNELS})
    rows = wide.hyperparameters["bigram_vocab_size"]
    assert wide.config["width"] == 768 and rows == 16768 and rows % 128 == 0, rows  # 50304 * 256 / 768, in 128s
    assert any(n.startswith("bigram_vocab_size 16768") for n in wide.notes), wide.notes
    asked = scale_record(with_table, {"bigram_vocab": 4096}, companions={"dc_triton_kernels.py": DC_KERNELS})
    assert asked.hyperparameters["bigram_vocab_size"] == 4096
