"""Tiny random models and a local tokenizer, for tests and examples (no hub).

`make_tiny_model(family, out_dir)` writes a folder that `AutoModelForCausalLM`
and `AutoTokenizer.from_pretrained(out_dir)` load like any checkpoint. The
tokenizer is byte-level with no merges: every byte is one token (so every
digit is a single token, as in the real models the RULER tasks assume), plus
ChatML special tokens and a chat template.

The families are those of `rf_eval.families.registered_families()`; each
family's tiny config is its own `tiny_config` (the shapes below plus the
family's `tiny_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rf_eval.families import family_class, registered_families
from rf_eval.families._tiny import (  # the families' tiny shapes, re-exported for tests
    TINY_HYBRID,
    TINY_SHAPES,
)
from rf_eval.files.checkpoints import MODEL_TYPES

__all__ = ["FAMILIES", "TINY_HYBRID", "TINY_SHAPES", "build_tokenizer", "make_tiny_model", "make_tiny_pair",
           "make_tiny_swiftkv", "random_model", "tiny_config", "with_chat_template"]

if TYPE_CHECKING:
    from transformers import PretrainedConfig

FAMILIES: tuple[str, ...] = registered_families()

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The same template with Qwen3's `enable_thinking` switch, in the form its template reads it: only an
# explicit false closes an empty think block (the chat rule's tests, `rf_eval.harness.chat`).
THINKING_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)


def build_tokenizer():
    """A byte-level tokenizer built in memory: 256 byte tokens + ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=TINY_SHAPES["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> PretrainedConfig:
    """The `transformers` config of the tiny model of `family` (`overrides` replace shared shapes)."""
    return family_class(family).tiny_config(vocab_size, **overrides)


def random_model(config: PretrainedConfig, seed: int = 0):
    """A fp32 model of `config` with seeded N(0, 0.08) weights (norms at their defaults), in eval mode.

    Larger-than-default weights make attention patterns and logits far from
    uniform, so a wrong fill shows up as a clear difference. The global RNG is
    left as it was.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2 and "norm" not in name:
                    p.normal_(0.0, 0.08)
    return model.eval()


def make_tiny_model(family: str, out_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a tiny random model of `family` plus the local tokenizer to `out_dir`.

    Deterministic: the same family, seed and `overrides` (config shapes, e.g.
    num_hidden_layers) give bitwise the same weights.
    """
    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    config = tiny_config(family, vocab_size=vocab, **overrides)  # an unknown family fails before any write
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.bos_token_id = None
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    model = random_model(config, seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# The source of a tiny source -> target pair: shallower and narrower than the target.
TINY_SOURCE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16)


def make_tiny_pair(family: str, out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """A tiny (source, target) pair of one family sharing the local tokenizer (RaReCache tests).

    The target is `make_tiny_model(family)`; the source has fewer layers, a
    smaller width and fewer KV heads (`TINY_SOURCE`).
    """
    out = Path(out_dir)
    source = make_tiny_model(family, out / "source", seed=seed + 1, **TINY_SOURCE)
    return source, make_tiny_model(family, out / "target", seed=seed)


def with_chat_template(model_dir: str | Path, out_dir: str | Path, template: str) -> Path:
    """A copy of a tiny model folder whose tokenizer has `template` as its chat template."""
    import shutil

    from transformers import AutoTokenizer

    out = Path(out_dir)
    shutil.copytree(model_dir, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = template
    tok.save_pretrained(out)
    return out


def make_tiny_swiftkv(out_dir: str | Path, family: str = "llama", num_key_value_layers: int = 3,
                      key_value_group_size: int = 1, seed: int = 0, like_own: bool = False) -> Path:
    """A tiny SwiftKV checkpoint in Snowflake's layout (`rf_eval.files.checkpoints`): the tiny model of `family`
    (llama or qwen2) plus SwiftKV's tensors, seeded N(0, 0.08) with norm_swiftkv near one; with
    `like_own`, each late layer's SwiftKV projections are its own q/k/v projections and norm_swiftkv is
    all ones (what the identity fill computes, written as SwiftKV)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    base_dir = make_tiny_model(family, out_dir, seed=seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model_type = next(t for t, of in MODEL_TYPES.items() if of == base.config.model_type)
    fields = {k: v for k, v in base.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(model_type, **fields, num_key_value_layers=num_key_value_layers,
                                  key_value_group_size=key_value_group_size)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all("_swiftkv" in name for name in missing), (missing, unexpected)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed + 1000)
        for name, param in model.named_parameters():
            if "_swiftkv" not in name:
                continue
            if like_own:
                own = name.replace("_swiftkv", "") if "norm_swiftkv" not in name else None
                param.copy_(model.get_parameter(own) if own else torch.ones_like(param))
            elif "norm_swiftkv" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.08)
    model.generation_config = base.generation_config
    model.save_pretrained(base_dir)
    return Path(base_dir)
