"""What stored token ids mean: the identity of the tokenizer that produced them.

Anything that keeps token ids on disk (a REST datastore, a suffix-decoding response cache) records the
identity of the tokenizer it was built with and refuses to serve a target whose tokenizer differs: the
same ids would mean other text, and the drafts would be silently useless.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerIdentity:
    """What a file's token ids mean: the tokenizer's name, a digest of its vocabulary, the id range."""

    name: str
    fingerprint: str
    vocab_size: int

    @classmethod
    def of(cls, target) -> TokenizerIdentity:
        """The identity of `target`'s tokenizer; targets without one (test models) speak raw ids."""
        tokenizer = target.tokenizer
        if tokenizer is None:
            return cls(f"{target.name} (no tokenizer: raw ids)", "raw-ids", target.vocab_size)
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
        digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
        return cls(f"{target.name} ({type(tokenizer).__name__})", "sha256:" + digest, target.vocab_size)

    def to_json(self) -> dict:
        return {"name": self.name, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size}

    def matches(self, other: TokenizerIdentity) -> bool:
        return self.fingerprint == other.fingerprint and self.vocab_size == other.vocab_size

    def describe(self) -> str:
        """`NAME (vocab N, sha256:0123456789ab)`, for error messages naming two identities."""
        return f"{self.name} (vocab {self.vocab_size}, {self.fingerprint[:19]})"
