"""Vision tower of the Qwen 3.5 vision-language model in plain PyTorch (imported lazily).

Patches arrive flattened as ``(num_patches, in_channels * temporal_patch_size * patch_size ** 2)`` with
a ``grid_thw`` row ``(t, h, w)`` per image or video, patches ordered in 2x2 spatial-merge blocks (the
layout of the Qwen image processor). The tower embeds each patch linearly (the weight keeps the Conv3d
shape of the checkpoints), adds a learned square position table resampled bilinearly to the image grid,
runs pre-norm ViT blocks with 2-D rotary attention restricted to each frame, and merges every block of
``spatial_merge_size ** 2`` patches into one token of the language model's width.

Parameter names: ``patch_embed.{weight,bias}``, ``pos_embed.weight``, ``blocks.<i>.{norm1, norm2,
attn.qkv, attn.proj, mlp.linear_fc1, mlp.linear_fc2}``, ``merger.{norm, linear_fc1, linear_fc2}``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hyper_parallel.models.qwen3_5.args import NUM_POSITION_EMBEDDINGS, Qwen3_5VisionArgs

__all__ = ["NUM_POSITION_EMBEDDINGS", "VisionTower"]

_ROPE_THETA = 10_000.0


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class PatchEmbed(nn.Module):
    """Linear patch embedding; ``weight`` has the Conv3d shape (hidden, C, T, P, P) of the checkpoints."""

    def __init__(self, args: Qwen3_5VisionArgs) -> None:
        super().__init__()
        shape = (
            args.hidden_size,
            args.in_channels,
            args.temporal_patch_size,
            args.patch_size,
            args.patch_size,
        )
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(args.hidden_size))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.linear(patches.to(self.weight.dtype), self.weight.flatten(1), self.bias)


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention within each frame, with 2-D rotary embeddings."""

    def __init__(self, args: Qwen3_5VisionArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.qkv = nn.Linear(args.hidden_size, 3 * args.hidden_size)
        self.proj = nn.Linear(args.hidden_size, args.hidden_size)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]
    ) -> torch.Tensor:
        seq = x.shape[0]
        q, k, v = self.qkv(x).view(seq, 3, self.n_heads, -1).unbind(1)
        cos, sin = rope[0][:, None, :], rope[1][:, None, :]
        q = (q.float() * cos + _rotate_half(q.float()) * sin).type_as(v)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).type_as(v)
        outputs = [
            F.scaled_dot_product_attention(qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1))
            for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
        ]
        out = torch.cat(outputs, dim=1).transpose(0, 1).reshape(seq, -1)
        result: torch.Tensor = self.proj(out)
        return result


class VisionMLP(nn.Module):
    def __init__(self, args: Qwen3_5VisionArgs) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(args.hidden_size, args.intermediate_size)
        self.linear_fc2 = nn.Linear(args.intermediate_size, args.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))
        return result


class VisionBlock(nn.Module):
    def __init__(self, args: Qwen3_5VisionArgs) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(args.hidden_size, eps=args.norm_eps)
        self.attn = VisionAttention(args)
        self.norm2 = nn.LayerNorm(args.hidden_size, eps=args.norm_eps)
        self.mlp = VisionMLP(args)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]
    ) -> torch.Tensor:
        h: torch.Tensor = x + self.attn(self.norm1(x), rope, lengths)
        out: torch.Tensor = h + self.mlp(self.norm2(h))
        return out


class PatchMerger(nn.Module):
    """LayerNorm per patch, concatenate each merge block, then a GELU MLP to the language-model width."""

    def __init__(self, args: Qwen3_5VisionArgs, out_dim: int) -> None:
        super().__init__()
        self.merged = args.hidden_size * args.spatial_merge_size**2
        self.norm = nn.LayerNorm(args.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).view(-1, self.merged)
        result: torch.Tensor = self.linear_fc2(F.gelu(self.linear_fc1(h)))
        return result


class VisionTower(nn.Module):
    """Patches (N, C*T*P*P) and ``grid_thw`` (images, 3) to merged tokens (N / merge**2, out_dim)."""

    def __init__(self, args: Qwen3_5VisionArgs, out_dim: int) -> None:
        super().__init__()
        self.args = args
        self.patch_embed = PatchEmbed(args)
        self.pos_embed = nn.Embedding(NUM_POSITION_EMBEDDINGS, args.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(args) for _ in range(args.depth))
        self.merger = PatchMerger(args, out_dim)

    def _block_order(self, grid: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(h, w, ...) grid to (h * w, ...) rows in spatial-merge-block order."""
        m = self.args.spatial_merge_size
        blocks = grid.reshape(h // m, m, w // m, m, *grid.shape[2:]).transpose(1, 2)
        return blocks.reshape(h * w, *grid.shape[2:])

    def _positions(self, grid_thw: list[list[int]], device: torch.device) -> torch.Tensor:
        """Learned position embeddings, bilinearly resampled (align_corners) to every image grid."""
        side = math.isqrt(NUM_POSITION_EMBEDDINGS)
        table = self.pos_embed.weight.view(side, side, -1).permute(2, 0, 1)[None]
        rows = []
        for t, h, w in grid_thw:
            grid = F.interpolate(table.float(), size=(h, w), mode="bilinear", align_corners=True)
            rows.append(self._block_order(grid[0].permute(1, 2, 0), h, w).repeat(t, 1))
        return torch.cat(rows).to(device)

    def _rope(self, grid_thw: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.args.hidden_size // self.args.n_heads
        spatial = head_dim // 2
        inv_freq = 1.0 / _ROPE_THETA ** (
            torch.arange(0, spatial, 2, dtype=torch.float32, device=device) / spatial
        )
        coords = []
        for t, h, w in grid_thw:
            hh, ww = torch.meshgrid(
                torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
            )
            coords.append(self._block_order(torch.stack((hh, ww), dim=-1), h, w).repeat(t, 1))
        pos = torch.cat(coords).float()
        angles = torch.cat((pos[:, :1] * inv_freq, pos[:, 1:] * inv_freq), dim=-1)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        grid = [[int(v) for v in row] for row in grid_thw.tolist()]
        lengths = [h * w for t, h, w in grid for _ in range(t)]
        x = self.patch_embed(patches)
        x = x + self._positions(grid, x.device).to(x.dtype)
        rope = self._rope(grid, x.device)
        for block in self.blocks:
            x = block(x, rope, lengths)
        merged: torch.Tensor = self.merger(x)
        return merged

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random initialisation: truncated-normal weights, zero biases, unit LayerNorms."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=std)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.patch_embed.weight, std=std)
        nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.pos_embed.weight, std=std)
