"""One tokenizer for two models: the vocabulary's fingerprint, and the check that a second model beside the
target (RaReCache's source, Speculative Prefill's speculator) reads the same token ids."""

from __future__ import annotations

import hashlib
import json

from rf_eval.fields import ArmError

__all__ = ["TokenizerMismatch", "check_tokenizers", "tokenizer_hash"]


class TokenizerMismatch(ArmError):
    """Source and target do not share a tokenizer: their caches have no row-to-row correspondence."""


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the token -> id vocabulary (added tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def check_tokenizers(source_tokenizer, target_tokenizer, method: str = "rarecache") -> str:
    """The shared vocabulary hash; TokenizerMismatch when the two tokenizers differ (RaReCache section 3.1: one
    cache row per token in both; Speculative Prefill's speculator scores the target's rows the same way)."""
    a, b = tokenizer_hash(source_tokenizer), tokenizer_hash(target_tokenizer)
    if a != b:
        na, nb = len(source_tokenizer), len(target_tokenizer)
        raise TokenizerMismatch(
            f"method={method} needs a source model and a target that share a tokenizer (one row per token in "
            f"both); these vocabularies differ (source {na} tokens, sha256 {a[:12]}...; target {nb} tokens, "
            f"{b[:12]}...)"
        )
    return a
