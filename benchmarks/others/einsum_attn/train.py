"""A small decoder in an einsum-first research style: attention scores and outputs through
torch.einsum, an additive causal mask built from torch.full(-inf).triu(1), RMSNorm written
as a division by the root mean square, a SwiGLU feed-forward, rotary embeddings applied
to half-split channels, and a plain functional training loop with a dict of settings.

Written for TrainBridge's benchmark of programs in other house styles.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = dict(dim=128, heads=4, depth=2, seq=128, batch=8, vocab=96, lr=1e-3, steps=10_000, seed=0)


class RootMeanSquareNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return self.scale * (x / rms)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim, seq):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.einsum("i,j->ij", torch.arange(seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        n = x.shape[-2]
        return x * self.cos[:n] + rotate_half(x) * self.sin[:n]


class Attention(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)
        self.rotary = Rotary(dim // heads, seq)
        self.register_buffer("causal", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        q, k = self.rotary(q), self.rotary(k)
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        sim = sim + self.causal[:n, :n]
        attn = sim.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.to_out(out.permute(0, 2, 1, 3).reshape(b, n, d))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Decoder(nn.Module):
    def __init__(self, dim, heads, depth, seq, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([])
        for _ in range(depth):
            self.layers.append(nn.ModuleList([RootMeanSquareNorm(dim), Attention(dim, heads, seq),
                                              RootMeanSquareNorm(dim), SwiGLU(dim, 4 * dim)]))
        self.norm = RootMeanSquareNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm1, attn, norm2, ff in self.layers:
            x = x + attn(norm1(x))
            x = x + ff(norm2(x))
        return self.head(self.norm(x))


def batches(cfg):
    g = torch.Generator().manual_seed(cfg["seed"])
    while True:
        start = torch.randint(0, cfg["vocab"], (cfg["batch"], 1), generator=g)
        seq = (start + torch.arange(cfg["seq"] + 1) * 5) % cfg["vocab"]
        yield seq[:, :-1], seq[:, 1:]


def main(cfg=CFG):
    torch.manual_seed(cfg["seed"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Decoder(cfg["dim"], cfg["heads"], cfg["depth"], cfg["seq"], cfg["vocab"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.1)
    data = batches(cfg)
    for step in range(cfg["steps"]):
        x, y = next(data)
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(step, round(loss.item(), 4))


if __name__ == "__main__":
    main()
