"""`source_rows`: a throwaway dropper (tests only) that loads a second model beside the target, as Speculative
Prefill does: the source (a model of the target's tokenizer) scores the rows by its last hidden state's norm and
the target prefills the top share of them at their own positions."""

from dataclasses import dataclass

import torch

from rf_eval.cost.mac_model import prefill_macs
from rf_eval.drop.base import Dropper, DropperArm


class SourceRows(Dropper):
    name = "source_rows"
    loads = ("source",)
    second_model = "source"
    budget_knob = "the kept rows"

    @dataclass(frozen=True, kw_only=True)
    class Arm(DropperArm):
        pass

    def keep_count(self, n):
        return max(1, int((self.arm.keep_share or 0.5) * n))

    @torch.no_grad()
    def keep_rows(self, ids, count):
        hidden = self.parts["source"](input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        return torch.topk(hidden.float().norm(dim=-1), count).indices.sort().values

    def score_macs(self, n):
        return prefill_macs(self.parts["source"].config, n)
