"""A small decoder-only transformer in torch, for apps/disagg: random
weights from a fixed seed (nothing downloaded), byte tokens, CPU, and a
KV cache laid out as the pool holds it -- one block per token with that
token's K and V of every layer -- so a prefill process can hand a
request's cache to a decode process block by block.

Greedy decoding on one CPU is deterministic: a decode that continues from
transferred blocks produces exactly the tokens the same model produces in
one process, which is what the disaggregation test checks."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

VOCAB = 256                   # bytes


class Config:
    def __init__(self, layers: int = 2, heads: int = 4, head_dim: int = 16,
                 max_tokens: int = 256, seed: int = 1234):
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.dim = heads * head_dim
        self.max_tokens, self.seed = max_tokens, seed

    @property
    def block(self) -> int:
        """float32 elements of one token's block: K and V of every layer."""
        return 2 * self.layers * self.dim


class Model:
    """Weights drawn from the config's seed; no training, no download."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])
        d = cfg.dim
        self.embed = torch.randn(VOCAB, d, generator=g)
        self.pos = torch.randn(cfg.max_tokens, d, generator=g)
        self.layers = [dict(qkv=w(d, 3 * d), out=w(d, d), up=w(d, 4 * d), down=w(4 * d, d))
                       for _ in range(cfg.layers)]
        self.head = w(d, VOCAB)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()

    @torch.no_grad()
    def forward(self, tokens: List[int], cache: torch.Tensor, start: int) -> torch.Tensor:
        """Run @tokens at positions start.. with @cache (blocks [T, block],
        positions < start filled) and fill their blocks; the logits of the
        last token."""
        cfg = self.cfg
        n = len(tokens)
        x = self.embed[tokens] + self.pos[start:start + n]
        h, hd = cfg.heads, cfg.head_dim
        for i, L in enumerate(self.layers):
            q, k, v = (self._norm(x) @ L["qkv"]).split(cfg.dim, dim=-1)
            kv = cache[:, 2 * i * cfg.dim:2 * (i + 1) * cfg.dim]   # this layer's K|V columns
            kv[start:start + n, :cfg.dim] = k
            kv[start:start + n, cfg.dim:] = v
            K = kv[:start + n, :cfg.dim].view(start + n, h, hd).transpose(0, 1)
            V = kv[:start + n, cfg.dim:].view(start + n, h, hd).transpose(0, 1)
            Q = q.view(n, h, hd).transpose(0, 1)
            att = Q @ K.transpose(1, 2) / math.sqrt(hd)
            causal = torch.arange(start, start + n)[:, None] >= torch.arange(start + n)[None, :]
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            x = x + (att @ V).transpose(0, 1).reshape(n, cfg.dim) @ L["out"]
            x = x + torch.relu(self._norm(x) @ L["up"]) @ L["down"]
        return self._norm(x[-1]) @ self.head

    def new_cache(self, tokens: int) -> torch.Tensor:
        return torch.zeros(tokens, self.cfg.block)

    def prefill(self, prompt: List[int], cache: Optional[torch.Tensor] = None
                ) -> Tuple[int, torch.Tensor]:
        """The prompt's blocks and the first generated token."""
        cache = self.new_cache(self.cfg.max_tokens) if cache is None else cache
        logits = self.forward(prompt, cache, 0)
        return int(logits.argmax()), cache

    def decode(self, cache: torch.Tensor, length: int, first: int, n: int) -> List[int]:
        """@n tokens after @first, from a cache whose blocks [0, length)
        hold the prompt."""
        out, tok = [first], first
        for pos in range(length, length + n - 1):
            tok = int(self.forward([tok], cache, pos).argmax())
            out.append(tok)
        return out

    def generate(self, prompt: List[int], n: int) -> List[int]:
        """The single-process reference: prefill and decode in one cache."""
        first, cache = self.prefill(prompt)
        return self.decode(cache, len(prompt), first, n)
