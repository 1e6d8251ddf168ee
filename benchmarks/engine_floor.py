"""The engine floor of every registered family on this machine, as a Markdown table (RidgeFill sections 4.3, 9).

    python benchmarks/engine_floor.py

For each family's tiny random model (fp32 and bf16, a 40-token prompt, split
3): the partial path with every row exact against the stock forward (bitwise
expected), and the filled-row kernel (masked SDPA over the key rows) against
it, as max |delta| / KL. tests/engine/test_engine_floor.py asserts the same bounds.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import AutoModelForCausalLM

from rf_eval.engine import partial_path_floors
from rf_eval.families import registered_families
from rf_eval.testing import make_tiny_model


def cell(result) -> str:
    return "bitwise" if result.bitwise else f"{result.max_abs:.1e} / {result.kl:.1e}"


def main() -> None:
    print("| family | partial path fp32 | partial path bf16 | filled-row kernel fp32 (max abs / KL) | bf16 |")
    print("|---|---|---|---|---|")
    for family in registered_families():
        path = make_tiny_model(family, tempfile.mkdtemp())
        partial, kernel = [], []
        for dtype in (torch.float32, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(7))
            floors = partial_path_floors(model, ids, 3)  # what `rf-eval check-equivalence` and the tests compare
            partial.append(cell(floors[0]))
            kernel.append(cell(floors[1]))
        print(f"| {family} | {partial[0]} | {partial[1]} | {kernel[0]} | {kernel[1]} |", flush=True)


if __name__ == "__main__":
    main()
