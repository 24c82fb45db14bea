"""Vanilla autoregressive decoding: one token per target forward (greedy or sampled).

With a lossy KV policy (`kv=streaming|quest|snapkv|h2o`) this is the lossy baseline: decode steps
attend only to what the policy selects.
"""

from __future__ import annotations

from core.policy_views import decode_view
from core.types import Counts
from decoders.base import BaseDecoder, extend_output
from decoders.verify import step_for


class Vanilla(BaseDecoder):
    name = "vanilla"

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.kv.lossless

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        tok = eng.stage([out[-1]])
        position = len(prompt)
        done = False
        while not done:
            view = decode_view(self.kv, eng, 1)
            logits, ids = step_for(self.sampler, eng, tok, eng.positions(position, 1), view)
            if ids is not None:  # greedy: the step's own argmax is the next step's token, on the device
                token, tok = int(ids[0]), ids
            else:
                token = self.sampler.pick(logits[0])
                tok = eng.stage([token])
            eng.commit([0])
            self.kv.after_commit(eng, 1)
            position += 1
            n, done = extend_output(out, [token], max_new_tokens, stop_ids)
            counts.step(1, 0, 0, n, view.kv_read(eng.length - 1))
