"""A single-file-trainer style script: settings are module globals overridden by
`exec(open("configurator.py").read())`, the precision is picked by a device conditional and
applied through an autocast context, the model lives in model.py, dropout is on, and the
optimizer is built by the model's own `configure_optimizers` (which passes `fused` itself).

Written for TrainBridge's benchmark of programs in other house styles.
"""
from contextlib import nullcontext

import torch

from model import GPT, GPTConfig

batch_size = 8
block_size = 128
n_layer = 2
n_head = 4
n_embd = 128
dropout = 0.1
max_iters = 100000
learning_rate = 1e-3
weight_decay = 0.1
seed = 1337
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
exec(open("configurator.py").read())

torch.manual_seed(seed)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
data = (torch.arange(65536) * 7 % 61).long()


def get_batch():
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


model = GPT(GPTConfig(block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                      dropout=dropout)).to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (0.9, 0.95), device_type)
for it in range(max_iters):
    X, Y = get_batch()
    with ctx:
        logits, loss = model(X, Y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
