"""A small GPT in the style of large-scale training frameworks: one fused QKV projection whose
output is viewed per head as [q | k | v] and split, attention through torch.baddbmm on
(sequence, batch*heads) layouts with the softmax scale as alpha and a boolean triu mask,
a hand-written RMSNorm, a bias-GELU written with erf, and arguments from argparse.

Written for TrainBridge's benchmark of programs in other house styles.
"""
import argparse
import math

import torch
import torch.nn.functional as F


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=96)
    parser.add_argument("--train-iters", type=int, default=10_000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args()


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.erf(x * 0.70710678))


class ParallelAttention(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.hidden_size_per_attention_head = args.hidden_size // args.num_attention_heads
        self.num_attention_heads_per_partition = args.num_attention_heads
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)
        self.query_key_value = torch.nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.dense = torch.nn.Linear(args.hidden_size, args.hidden_size)
        mask = torch.triu(torch.ones(args.seq_length, args.seq_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("attention_mask", mask, persistent=False)

    def forward(self, hidden_states):
        # hidden_states: [s, b, h]
        s, b, _ = hidden_states.size()
        mixed_x_layer = self.query_key_value(hidden_states)
        new_tensor_shape = mixed_x_layer.size()[:-1] + (
            self.num_attention_heads_per_partition, 3 * self.hidden_size_per_attention_head)
        mixed_x_layer = mixed_x_layer.view(*new_tensor_shape)
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, self.hidden_size_per_attention_head, dim=-1)
        np_, hn = self.num_attention_heads_per_partition, self.hidden_size_per_attention_head
        # [s, b, np, hn] -> [b * np, s, hn]
        q = query_layer.reshape(s, b * np_, hn).transpose(0, 1)
        k = key_layer.reshape(s, b * np_, hn).transpose(0, 1)
        v = value_layer.reshape(s, b * np_, hn).transpose(0, 1)
        matmul_result = torch.empty(b * np_, s, s, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(matmul_result, q, k.transpose(1, 2), beta=0.0, alpha=1.0 / self.norm_factor)
        scores = scores.masked_fill(self.attention_mask[:s, :s], -10000.0)
        probs = torch.softmax(scores, dim=-1)
        context = torch.bmm(probs, v)
        # [b * np, s, hn] -> [s, b, h]
        context = context.transpose(0, 1).reshape(s, b, np_ * hn)
        return self.dense(context)


class ParallelMLP(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.dense_h_to_4h = torch.nn.Linear(args.hidden_size, 4 * args.hidden_size, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(4 * args.hidden_size))
        self.dense_4h_to_h = torch.nn.Linear(4 * args.hidden_size, args.hidden_size)

    def forward(self, hidden_states):
        intermediate = bias_gelu(self.bias, self.dense_h_to_4h(hidden_states))
        return self.dense_4h_to_h(intermediate)


class ParallelTransformerLayer(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size)
        self.self_attention = ParallelAttention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size)
        self.mlp = ParallelMLP(args)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attention(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class GPTModel(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = torch.nn.Embedding(args.seq_length, args.hidden_size)
        self.layers = torch.nn.ModuleList([ParallelTransformerLayer(args) for _ in range(args.num_layers)])
        self.final_layernorm = RMSNorm(args.hidden_size)
        self.output_layer = torch.nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        for emb in (self.word_embeddings, self.position_embeddings):
            torch.nn.init.normal_(emb.weight, std=0.02)

    def forward(self, tokens, labels):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        hidden = (self.word_embeddings(tokens) + self.position_embeddings(positions)).transpose(0, 1).contiguous()
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.output_layer(self.final_layernorm(hidden)).transpose(0, 1)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))


def get_batch(args, generator):
    start = torch.randint(0, args.vocab_size, (args.micro_batch_size, 1), generator=generator)
    tokens = (start * 7 + torch.arange(args.seq_length + 1) * 3) % args.vocab_size
    return tokens[:, :-1], tokens[:, 1:]


def pretrain(args):
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = GPTModel(args).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    generator = torch.Generator().manual_seed(args.seed)
    for iteration in range(args.train_iters):
        tokens, labels = get_batch(args, generator)
        loss = model(tokens.to(device), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if iteration % 100 == 0:
            print(f"iteration {iteration} lm loss {loss.item():.4f}")


if __name__ == "__main__":
    pretrain(get_args())
