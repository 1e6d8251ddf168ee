"""Tiny random models and a local tokenizer, for tests and examples (no hub).

`make_tiny_model(family, out_dir)` writes a folder that `AutoModelForCausalLM`
and `AutoTokenizer.from_pretrained(out_dir)` load like any checkpoint. The
tokenizer is byte-level with no merges: every byte is one token (so every
digit is a single token, as in the real models the RULER tasks assume), plus
ChatML special tokens and a chat template.
"""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("llama", "qwen3", "qwen3_5", "qwen3_next", "mistral")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Shapes shared by all families: small enough for fast CPU tests, large enough
# that grouped-query attention, QK-norm and partial RoPE are all exercised.
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
_HYBRID = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    # alternate Gated DeltaNet and gated attention so both sides of a split hold both kinds
    layer_types=["linear_attention", "full_attention"] * 3,
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
        model_max_length=_COMMON["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(family: str, vocab_size: int, **overrides):
    """The `transformers` config of the tiny model of `family` (`overrides` replace shared shapes)."""
    import transformers as tf

    ids = dict(vocab_size=vocab_size, pad_token_id=vocab_size - 3, eos_token_id=vocab_size - 1)
    common = {**_COMMON, **overrides}
    if family == "llama":
        return tf.LlamaConfig(**common, **ids, rope_theta=10000.0)
    if family == "qwen3":
        return tf.Qwen3Config(**common, **ids)
    if family == "mistral":
        return tf.MistralConfig(**common, **ids, sliding_window=None)  # v0.2 and later: no sliding window
    if family == "qwen3_5":
        return tf.Qwen3_5TextConfig(**common, **_HYBRID, **ids)
    if family == "qwen3_next":
        return tf.Qwen3NextConfig(
            **common,
            **_HYBRID,
            **ids,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            decoder_sparse_step=1,
        )
    raise ValueError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")


def make_tiny_model(family: str, out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """Write a tiny random model of `family` plus the local tokenizer to `out_dir`.

    Deterministic: the same family, seed and `overrides` (config shapes, e.g.
    num_hidden_layers) give bitwise the same weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    config = tiny_config(family, vocab_size=vocab, **overrides)
    config.bos_token_id = None
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Larger-than-default weights make attention patterns and logits far
        # from uniform, so a wrong fill shows up as a clear difference.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2 and "norm" not in name:
                    p.normal_(0.0, 0.08)
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
