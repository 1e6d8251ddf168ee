"""Family lookup: sliding-window attention is refused where the engine would fill rows."""

import pytest
import torch
import transformers as tf

from rf_eval.cli.check_equivalence import compare
from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.families import family_for, sliding_window
from rf_eval.ridgefill.maps import identity_fill
from rf_eval.testing import tiny_config


@pytest.mark.parametrize(
    "config, window",
    [
        (tf.LlamaConfig(), None),
        (tf.Qwen3Config(), None),  # use_sliding_window false: sliding_window is None
        (tf.Qwen3Config(use_sliding_window=True, max_window_layers=2, num_hidden_layers=4), 4096),
        (tf.Qwen3Config(use_sliding_window=True, max_window_layers=4, num_hidden_layers=4), None),  # no sliding layer
        (tf.MistralConfig(), 4096),  # Mistral 7B v0.1
        (tf.MistralConfig(sliding_window=None), None),  # v0.2 and later
        (tf.MistralConfig(sliding_window=8192, max_position_embeddings=8192), None),  # the window covers the context
    ],
)
def test_sliding_window_of_configs(config, window):
    assert sliding_window(config) == window


def test_filled_arms_refuse_a_sliding_window_and_the_plain_path_stays(one_torch_thread):
    config = tiny_config("qwen3", vocab_size=259, use_sliding_window=True, sliding_window=16, max_window_layers=2)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="sliding window of 16 tokens"):
        family_for(model.config)
    ids = torch.randint(0, 250, (1, 48), generator=torch.Generator().manual_seed(0))
    ref = plain_prefill(model, ids)
    assert compare(prefill(model, ids, Plan(split=3, tail=1, fill="exact")), ref) is None  # fill off: no family needed
    with pytest.raises(ValueError, match="sliding-window layers are not supported"):
        prefill(model, ids, Plan(split=3, tail=8, fill="identity"), fill=identity_fill)
