"""What the engine needs to know about one architecture's layers.

A *family* computes, for a decoder layer of its architecture and a set of
rows, the pieces the partial-prefill engine runs separately: keys/values
from a (normed) layer input, queries (and an output gate where the family
has one), the attention output projection, and the MLP. Everything else
(embedding, masks, RoPE tables, final norm) stays inside the `transformers`
model, and every weight and function used here is the module's own.

A family also describes itself, so that a new architecture is one module
under rf_eval/families/ (found by `rf_eval.families.registered_families`,
no list to edit): the `model_types` it serves, the tiny random test model
(`tiny_config`: the shared shapes of `rf_eval.families._tiny` plus `tiny_settings`)
and the facts the MAC cost model (`rf_eval.cost.mac_model`) branches on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from rf_eval.families._tiny import TINY_SHAPES

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def execution_device(module: nn.Module) -> torch.device:
    """Where a module runs: accelerate's execution device for a dispatched one (device_map, offload), else its
    parameters' device."""
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if device is not None:
        return torch.device(device)
    return next(module.parameters()).device


class Family:
    """Layer internals of one architecture (default: Llama-style attention)."""

    #: the HF config `model_type`s this family serves; the first is its tiny test model's
    model_types: ClassVar[tuple[str, ...]] = ()
    #: function `(q, k, cos, sin) -> (q_rot, k_rot)` from the model's modeling module
    apply_rope: ClassVar = None
    #: config arguments of the tiny test model beyond `rf_eval.families._tiny.TINY_SHAPES`
    tiny_settings: ClassVar[dict[str, Any]] = {}
    #: what the layers hold beyond Llama's, in a few words each (the README's families table)
    traits: ClassVar[tuple[str, ...]] = ()

    # -- facts of the MAC cost model (rf_eval.cost.mac_model) ------------------------------------
    #: q_proj also yields a sigmoid output gate, as wide as the queries
    gated_attention: ClassVar[bool] = False
    #: the config's `num_experts`, `moe_intermediate_size`, ... describe a sparse MoE MLP
    moe_mlp: ClassVar[bool] = False
    #: the config's `layer_types` name Gated DeltaNet (`linear_attention`) layers
    linear_attention: ClassVar[bool] = False

    @classmethod
    def tiny_config(cls, vocab_size: int, **overrides: Any) -> PretrainedConfig:
        """The config of this family's tiny random model (`overrides` replace shared shapes and settings)."""
        from transformers import AutoConfig

        ids = dict(vocab_size=vocab_size, pad_token_id=vocab_size - 3, eos_token_id=vocab_size - 1)
        return AutoConfig.for_model(cls.model_types[0], **{**TINY_SHAPES, **ids, **cls.tiny_settings, **overrides})

    # -- layer kinds -------------------------------------------------------------
    @staticmethod
    def is_recurrent(layer: nn.Module) -> bool:
        """True for Gated DeltaNet (linear-attention) layers."""
        return hasattr(layer, "linear_attn")

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """Raise ValueError, saying why, for a config of this family the engine cannot run as the model."""

    # -- the model's head ---------------------------------------------------------------------------
    @staticmethod
    def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The model's logits for last-layer outputs x (1, n, d): final norm and lm_head, each on its device."""
        h = model.model.norm(x.to(execution_device(model.model.norm)))
        return model.lm_head(h.to(execution_device(model.lm_head)))

    # -- the block's structure (pre-norm by default; post-norm and sandwich families override) --------
    @staticmethod
    def input_norm(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The block's input norm: what the attention (or mixer) projections read."""
        return layer.input_layernorm(x)

    @staticmethod
    def attention_residual(layer: nn.Module, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The residual stream after the attention (or mixer) sub-block: x + mixed."""
        return x + mixed

    @staticmethod
    def sliding_window(attn: nn.Module) -> int | None:
        """The window of this attention layer (keys within `window` rows of the query), None for full attention.

        The module's own per-layer `sliding_window` where it has one (Qwen2/3,
        Gemma3, GPT-OSS), else the config's (Mistral v0.1, Phi3: every layer).
        """
        if hasattr(attn, "sliding_window"):
            return attn.sliding_window
        return getattr(attn.config, "sliding_window", None)

    # -- RoPE tables (one kind by default; Gemma 3 rotates local and global layers differently) ------
    @staticmethod
    def rope_kind(layer: nn.Module) -> str | None:
        """The RoPE tables this layer reads (a key of `rope_tables`); None: the same as every layer."""
        return None

    @staticmethod
    def rope_tables(model: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict | None:
        """Every RoPE kind's (cos, sin) at `position_ids`, from the model's own rotary module; None: one kind."""
        return None

    @staticmethod
    def attention_sinks(attn: nn.Module) -> torch.Tensor | None:
        """Per-head attention-sink logits (heads,) that take softmax weight and give no value; None without."""
        return None

    # -- attention pieces ---------------------------------------------------------
    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on one tensor (B, heads, n, D) with the model's own rotation function."""
        return type(self).apply_rope(x, x, cos, sin)[1]

    def project_kv(self, attn: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys before RoPE and values, (B, kv_heads, n, D), from normed input h (B, n, d)."""
        shape = (*h.shape[:-1], -1, attn.head_dim)
        k = attn.k_proj(h).view(shape)
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        v = attn.v_proj(h).view(shape)
        return k.transpose(1, 2), v.transpose(1, 2)

    def kv(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys (rotated at their positions) and values as the layer writes them to its cache."""
        k, v = self.project_kv(attn, h)
        return self.rotate(k, cos, sin), v

    def query(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries (B, heads, n, D) and the output gate (None without one)."""
        shape = (*h.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(h).view(shape)
        if hasattr(attn, "q_norm"):
            q = attn.q_norm(q)
        return self.rotate(q.transpose(1, 2), cos, sin), None

    def attention_output(self, attn: nn.Module, context: torch.Tensor, gate: torch.Tensor | None):
        """o_proj of the attention context (B, n, heads*D), gated where the family gates."""
        if gate is not None:
            context = context * torch.sigmoid(gate)
        return attn.o_proj(context)

    # -- Gated DeltaNet pieces (families with `linear_attention`) --------------------
    def delta_inputs(self, mixer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What drives a Gated DeltaNet layer's state update, from its normed input h (B, n, d).

        RidgeFill section 2.1: a filled row contributes the recurrent state update.
        Returns the mixed queries/keys/values the short convolution reads
        (B, n, 2 * key_dim + value_dim, in the module's own order), beta's input b
        and the gate input a (B, n, value heads), from the module's own projections.
        """
        raise NotImplementedError(f"{type(self).__name__} has no Gated DeltaNet layers")

    def log_gates(self, mixer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """log g per row and value head (n, heads), fp64, from the normed input h (1, n, d).

        RidgeFill section 2.3 and appendix H: g = exp(-exp(A_log) * softplus(a + dt_bias)),
        the decay the module applies, from its own parameters.
        """
        a = self.delta_inputs(mixer, h)[2][0].float()
        return (-mixer.A_log.float().exp() * F.softplus(a + mixer.dt_bias.float())).double()

    # -- the rest of the block ------------------------------------------------------
    def mlp(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """The block's second half: h + MLP(post_attention_layernorm(h))."""
        out = layer.mlp(layer.post_attention_layernorm(h))
        if isinstance(out, tuple):  # MoE blocks may also return router logits
            out = out[0]
        return h + out


class GatedAttentionFamily(Family):
    """Qwen3.5 / Qwen3-Next attention: q_proj yields query and a sigmoid output gate."""

    gated_attention = True

    def query(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        lead = h.shape[:-1]
        q, gate = torch.chunk(attn.q_proj(h).view(*lead, -1, attn.head_dim * 2), 2, dim=-1)
        q = attn.q_norm(q).transpose(1, 2)
        return self.rotate(q, cos, sin), gate.reshape(*lead, -1)


KERNEL_FALLBACK = "falling back to its reference PyTorch implementation"


class CudaOnlyKernelAdvice(logging.Filter):
    """transformers warns, once per kernel and process, that a linear-attention kernel (the gated delta rule,
    the short convolution) falls back to PyTorch because flash-linear-attention or causal-conv1d is not
    installed. Those packages' kernels run on CUDA only: on a machine without CUDA the advice cannot apply
    to the run, so the warning is dropped there; wherever CUDA exists it is kept (it concerns the run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return KERNEL_FALLBACK not in record.getMessage() or torch.cuda.is_available()


def _quiet_cpu_kernel_advice() -> None:
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    if not any(isinstance(f, CudaOnlyKernelAdvice) for f in logger.filters):
        logger.addFilter(CudaOnlyKernelAdvice())


_quiet_cpu_kernel_advice()  # the hybrid families' modules import this one before their models run
