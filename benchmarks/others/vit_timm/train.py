"""A small vision transformer in the style of image-model libraries: a Conv2d patch embedding,
a class token and learned positions, pre-norm blocks with `attn = (q @ k.transpose(-2, -1))
* self.scale` and no mask, nn.GELU, DropPath-free, an MLP head, trained on synthetic
images whose class is set by a bright quadrant, with SGD + momentum and label smoothing.

Written for TrainBridge's benchmark of programs in other house styles.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class PatchEmbed(nn.Module):
    def __init__(self, img_size=32, patch_size=4, in_chans=3, embed_dim=128):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, num_heads=4, qkv_bias=True):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads=num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, img_size=32, patch_size=4, num_classes=4, embed_dim=128, depth=3, num_heads=4):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, 3, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.blocks(x + self.pos_embed)
        return self.norm(x)

    def forward(self, x):
        return self.head(self.forward_features(x)[:, 0])


def synthetic_batch(batch_size, generator):
    labels = torch.randint(0, 4, (batch_size,), generator=generator)
    images = torch.randn(batch_size, 3, 32, 32, generator=generator) * 0.5
    for i, c in enumerate(labels.tolist()):
        r, q = divmod(c, 2)
        images[i, :, r * 16:(r + 1) * 16, q * 16:(q + 1) * 16] += 1.0
    return images, labels


def train_one_epoch(model, optimizer, steps, batch_size, device, generator):
    model.train()
    for step in range(steps):
        images, labels = synthetic_batch(batch_size, generator)
        images, labels = images.to(device), labels.to(device)
        output = model(images)
        loss = F.cross_entropy(output, labels, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    torch.manual_seed(42)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = VisionTransformer().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    train_one_epoch(model, optimizer, steps, 32, device, torch.Generator().manual_seed(42))


if __name__ == "__main__":
    main()
