"""A small causal LM in the style of model-hub libraries: a config object, Conv1D projections
(weights stored transposed, applied with addmm), attention in an `_attn` method with a
`torch.where` causal mask filled with the dtype's minimum, a GELU activation class written
out with tanh, and a training loop that reads its settings from the config.

Written for TrainBridge's benchmark of programs in other house styles.
"""
import math

import torch
from torch import nn


class LMConfig:
    def __init__(self, **kwargs):
        self.vocab_size = kwargs.get("vocab_size", 96)
        self.n_positions = kwargs.get("n_positions", 128)
        self.n_embd = kwargs.get("n_embd", 128)
        self.n_layer = kwargs.get("n_layer", 2)
        self.n_head = kwargs.get("n_head", 4)
        self.layer_norm_epsilon = kwargs.get("layer_norm_epsilon", 1e-5)
        self.initializer_range = kwargs.get("initializer_range", 0.02)


class Conv1D(nn.Module):
    """A linear layer whose weight is stored (in_features, out_features)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class LMAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        max_positions = config.n_positions
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions),
            persistent=False,
        )
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_heads
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / math.sqrt(value.size(-1))
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output

    def _split_heads(self, tensor):
        new_shape = tensor.size()[:-1] + (self.num_heads, self.head_dim)
        return tensor.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, tensor):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        return tensor.view(tensor.size()[:-2] + (self.num_heads * self.head_dim,))

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query = self._split_heads(query)
        key = self._split_heads(key)
        value = self._split_heads(value)
        attn_output = self._attn(query, key, value)
        return self.c_proj(self._merge_heads(attn_output))


class LMMLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, intermediate_size)
        self.act = NewGELUActivation()

    def forward(self, hidden_states):
        return self.c_proj(self.act(self.c_fc(hidden_states)))


class LMBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = LMAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = LMMLP(4 * config.n_embd, config)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class LMHeadModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList([LMBlock(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        nn.init.normal_(self.wte.weight, std=config.initializer_range)
        nn.init.normal_(self.wpe.weight, std=config.initializer_range)

    def forward(self, input_ids, labels=None):
        position_ids = torch.arange(input_ids.size(-1), device=input_ids.device).unsqueeze(0)
        hidden_states = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            hidden_states = block(hidden_states)
        logits = self.lm_head(self.ln_f(hidden_states))
        loss = None
        if labels is not None:
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = nn.functional.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return loss, logits


class TrainingArguments:
    per_device_train_batch_size = 8
    seq_len = 128
    learning_rate = 3e-4
    weight_decay = 0.01
    max_steps = 10_000
    seed = 7


def make_batch(args, config, generator):
    """Sequences with structure to learn: each token is the previous one plus a per-row stride."""
    start = torch.randint(0, config.vocab_size, (args.per_device_train_batch_size, 1), generator=generator)
    stride = torch.randint(1, 5, (args.per_device_train_batch_size, 1), generator=generator)
    return (start + stride * torch.arange(args.seq_len)) % config.vocab_size


def train(args=TrainingArguments()):
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = LMConfig()
    model = LMHeadModel(config).to(device)
    no_decay = ["bias", "ln_"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    for step in range(args.max_steps):
        input_ids = make_batch(args, config, generator).to(device)
        loss, _ = model(input_ids, labels=input_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    train()
