"""A sequence classifier trained the way Keras-style wrappers do it: the model is a list of
layer specifications built by a factory, a `Model` wrapper with `compile(optimizer, loss)`
and `fit(data, epochs, callbacks)`, a callback that records the loss, and an encoder made
of LayerNorm, multi-head self-attention written with matmul and a padding-free softmax,
and a GELU feed-forward built from nn.Sequential.

Written for TrainBridge's benchmark of programs in other house styles.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SPEC = [("embedding", {"vocab": 64, "dim": 96}), ("encoder", {"dim": 96, "heads": 4}),
        ("encoder", {"dim": 96, "heads": 4}), ("pool", {}), ("dense", {"dim": 96, "units": 8})]


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        h, d = self.heads, self.dim // self.heads
        q = self.query(x).view(b, t, h, d).transpose(1, 2)
        k = self.key(x).view(b, t, h, d).transpose(1, 2)
        v = self.value(x).view(b, t, h, d).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, self.dim)
        return self.out(context)


class Encoder(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.feed_forward(self.norm2(x))


class MeanPool(nn.Module):
    def forward(self, x):
        return x.mean(dim=1)


def build(spec):
    layers = []
    for kind, kw in spec:
        if kind == "embedding":
            layers.append(nn.Embedding(kw["vocab"], kw["dim"]))
        elif kind == "encoder":
            layers.append(Encoder(kw["dim"], kw["heads"]))
        elif kind == "pool":
            layers.append(MeanPool())
        elif kind == "dense":
            layers.append(nn.Linear(kw["dim"], kw["units"]))
    return nn.Sequential(*layers)


class History:
    def __init__(self):
        self.losses = []

    def on_batch_end(self, batch, logs):
        self.losses.append(logs["loss"])


class Model:
    def __init__(self, network):
        self.network = network

    def compile(self, optimizer, loss):
        self.optimizer, self.loss_fn = optimizer, loss

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.network(x), y)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach()}

    def fit(self, data, epochs=1, steps_per_epoch=10_000, callbacks=()):
        for epoch in range(epochs):
            for batch in range(steps_per_epoch):
                x, y = next(data)
                logs = self.train_step(x, y)
                for cb in callbacks:
                    cb.on_batch_end(batch, logs)


def dataset(batch_size=16, length=96, seed=3):
    """Class = which of 8 marker tokens appears most often."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(8, 64, (batch_size, length), generator=g)
        y = torch.randint(0, 8, (batch_size,), generator=g)
        marks = torch.rand(batch_size, length, generator=g) < 0.2
        x = torch.where(marks, y[:, None].expand(-1, length), x)
        yield x, y


def main():
    torch.manual_seed(3)
    model = Model(build(SPEC))
    model.compile(torch.optim.Adam(model.network.parameters(), lr=1e-3), nn.CrossEntropyLoss())
    history = History()
    model.fit(dataset(), epochs=1, callbacks=[history])


if __name__ == "__main__":
    main()
