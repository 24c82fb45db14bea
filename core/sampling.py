"""Greedy and sampled token choice (temperature, top-k, top-p), seeded."""

from __future__ import annotations

import math

import torch

from core.types import HarnessError


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> None:
        for field, value, ok, allowed in (
            ("temperature", temperature, lambda x: x >= 0, "a number >= 0 (0 = greedy)"),
            ("top_p", top_p, lambda x: 0 < x <= 1, "a number in (0, 1]"),
            ("top_k", top_k, lambda x: x >= 0 and float(x).is_integer(), "an integer >= 0 (0 = off)"),
        ):
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not ok(value):
                raise HarnessError(f"sampling.{field} must be {allowed}, got {value!r}")
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self._on_device: dict[torch.device, torch.Generator] = {}  # `device_draw`'s, off the CPU

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def reseed(self, seed: int) -> None:
        self.seed = int(seed)
        self.generator.manual_seed(seed)
        for gen in self._on_device.values():
            gen.manual_seed(seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution actually sampled from (after temperature, top-k, top-p); rows are [.., vocab]."""
        x = logits.float() / max(self.temperature, 1e-8)
        if self.top_k:
            kth = torch.topk(x, min(self.top_k, x.shape[-1]), dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        p = torch.softmax(x, dim=-1)
        if self.top_p < 1.0:
            sp, idx = torch.sort(p, dim=-1, descending=True)
            cum = sp.cumsum(-1)
            drop = cum - sp > self.top_p  # keep the smallest prefix whose mass reaches top_p
            sp = sp.masked_fill(drop, 0.0)
            p = torch.zeros_like(p).scatter(-1, idx, sp)
            p = p / p.sum(-1, keepdim=True)
        return p

    def sample_from(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p.cpu(), 1, generator=self.generator).item())

    def device_draw(self, p: torch.Tensor) -> torch.Tensor:
        """A token from each row of `p [.., vocab]`, left on p's device (no read: a drafter feeds it to
        its next step): the exponential race, argmax_x p(x) / E_x with E_x ~ Exp(1) independent, which
        picks x with probability p(x) (as `torch.multinomial` draws one sample). Off the CPU from a
        generator of that device, seeded as the sampler."""
        if p.device.type == "cpu":
            gen = self.generator
        else:
            gen = self._on_device.get(p.device)
            if gen is None:
                gen = self._on_device[p.device] = torch.Generator(p.device).manual_seed(self.seed)
        race = torch.empty_like(p, dtype=torch.float32).exponential_(generator=gen)
        return (p.float() / race).argmax(-1)

    def pick(self, logits: torch.Tensor) -> int:
        if self.greedy:
            return int(logits.argmax(-1).item())
        return self.sample_from(self.probs(logits))
