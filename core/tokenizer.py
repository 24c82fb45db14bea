"""A byte-level tokenizer for the tiny random-weight test models (no files, no hub)."""

from __future__ import annotations


class ByteTokenizer:
    """ids 0..255 are bytes; 256 = BOS, 257 = EOS, 258/259 = role markers. Vocab 260."""

    bos_token_id, eos_token_id, user_id, assistant_id = 256, 257, 258, 259
    vocab_size = 260
    name_or_path = "byte-tokenizer"
    chat_template = "byte"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **_: object,
    ) -> list[int] | str:
        ids = [self.bos_token_id]
        for msg in messages:
            ids.append(self.user_id if msg["role"] == "user" else self.assistant_id)
            ids.extend(self.encode(msg["content"]))
            ids.append(self.eos_token_id)
        if add_generation_prompt:
            ids.append(self.assistant_id)
        return ids if tokenize else self.decode(ids)
