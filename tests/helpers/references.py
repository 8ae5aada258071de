"""Independent reference implementations, written naively, that layers are checked against:
windowed attention, and the joined multi-branch ViT layers of the depth re-parameterization paper
(its §3.3: the logit join, Eq. 5, and the FFN join, Eq. 9; ``join='qkv'`` is mmrepa's extension,
docs/backbones/depth_rep_vit.md) branch by branch."""

import math

import torch
import torch.nn.functional as F


def naive_windowed_attention(attn, x, window):
    """Plain softmax attention of each window's real tokens (no padding, no masks)."""
    B, H, W, C = x.shape
    out = torch.empty(B, H, W, C, dtype=x.dtype)
    w = window or max(H, W)
    for r in range(0, H, w):
        for c in range(0, W, w):
            tokens = x[:, r : r + w, c : c + w]
            h, wd = tokens.shape[1:3]
            qkv = attn.qkv(tokens.reshape(B, h * wd, C))
            q, k, v = qkv.view(B, h * wd, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim), dim=-1)
            y = (a @ v).transpose(1, 2).reshape(B, h * wd, -1)
            out[:, r : r + w, c : c + w] = attn.proj(y).view(B, h, wd, C)
    return out


def reference_attention(attn, u, lam, valid=None):
    """The logit join (§3.3, Eq. 5) or the qkv join, branch by branch, with explicit N×N
    logits per branch."""
    B, N, d = u.shape
    n, H = attn.num_branches, attn.num_heads
    dh = d // H
    qs, ks, vs, projs = [], [], [], []
    for s in attn.branch_state_dicts():
        q, k, v = (
            (u @ s['qkv.weight'].T + s['qkv.bias']).view(B, N, 3, H, dh).permute(2, 0, 3, 1, 4)
        )
        qs.append(q), ks.append(k), vs.append(v), projs.append(s)
    out = 0
    for b in range(n):
        if attn.join == 'logits':
            logits = [qs[c] @ ks[c].transpose(-1, -2) for c in range(n)]
            mixed = logits[b] + lam * sum(logits[c] for c in range(n) if c != b)
            mixed = mixed / ((1 + (n - 1) * lam**2) ** 0.5 * dh**0.5)
            value = vs[b]
        else:

            def join(t, b=b):
                return t[b] + lam * sum(t[c] for c in range(n) if c != b)

            mixed = join(qs) @ join(ks).transpose(-1, -2) / ((1 + (n - 1) * lam**2) * dh**0.5)
            value = join(vs)
        if valid is not None:
            mixed = mixed.masked_fill(~valid[:, None, None, :], float('-inf'))
        heads = (mixed.softmax(-1) @ value).transpose(1, 2).reshape(B, N, d)
        out = out + heads @ projs[b]['proj.weight'].T + projs[b]['proj.bias']
    return out


def reference_ffn(ffn, v, lam):
    n = ffn.num_branches
    z = [v @ s['fc1.weight'].T + s['fc1.bias'] for s in ffn.branch_state_dicts()]
    out = 0
    for b, s in enumerate(ffn.branch_state_dicts()):
        joined = z[b] + lam * sum(z[c] for c in range(n) if c != b)
        out = out + F.gelu(joined) @ s['fc2.weight'].T + s['fc2.bias']
    return out


def reference_windows(attn, u, lam, hw, ws):
    """Windowed attention with no padding at all: each window (cut short at the right and
    bottom edges) attends among its real tokens only."""
    B, N, d = u.shape
    H, W = hw
    grid = u.view(B, H, W, d)
    out = torch.empty_like(grid)
    for i in range(0, H, ws):
        for j in range(0, W, ws):
            window = grid[:, i : i + ws, j : j + ws]
            h, w = window.shape[1:3]
            out[:, i : i + ws, j : j + ws] = reference_attention(
                attn, window.reshape(B, h * w, d), lam
            ).view(B, h, w, d)
    return out.view(B, N, d)


def reference_block(blk, x, valid=None, hw=None):
    lam = blk.current_join_lambda
    u = blk.norm1(x)
    if blk.window_size is None:
        x = x + reference_attention(blk.attn, u, lam, valid)
    else:
        x = x + reference_windows(blk.attn, u, lam, hw, blk.window_size)
    return x + reference_ffn(blk.mlp, blk.norm2(x), lam)
