"""`ModelSource`: where a run's model comes from, before its weights load (its own module: `Method` and the
request helpers that build a method on the meta device both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["REMOTE_KEYS", "ModelSource"]

#: the `from_pretrained` keys every load of a run shares (its model, config, tokenizer and second model)
REMOTE_KEYS = ("revision", "trust_remote_code", "subfolder")


@dataclass(frozen=True)
class ModelSource:
    """Where a run's model comes from, before its weights load: what `Method.prepare` checks an arm against.

    `pretrained` and its `config`; `tokenizer`: the name or folder its tokenizer loads from; `remote`: the
    `from_pretrained` keys every load shares (revision, trust_remote_code, subfolder); `files`: the values of
    the method's `loads` that the run gave (a maps path, a source model)."""

    pretrained: str
    config: Any
    tokenizer: str
    remote: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
