"""A NaN the oracle does not have is located: its (token, head, dim), the
oracle's value there, and what the merge read there (both LSEs, both partial
values), so an unmapped +inf shows at once."""

from __future__ import annotations

import re

import torch

from harness.cases.suites import load_suite
from harness.kernels.numeric import MergeInputs
from harness.sides.items import PORT_ERROR
from harness.sides.runner import compare_merge
from oracle.side import OracleSide
from ports.per_request import PerRequestPort


class ForgetsPosInf(PerRequestPort):
    """A porting bug: the merge never maps an LSE of +inf to -inf (upstream's
    convention for a side with no keys), so inf - inf makes NaN there."""

    name = "forgets-pos-inf"

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        p_lse, s_lse = inputs.prefix_lse.float(), inputs.suffix_lse.float()
        top = torch.maximum(p_lse, s_lse)
        p_weight, s_weight = torch.exp(p_lse - top), torch.exp(s_lse - top)
        total = p_weight + s_weight
        p_scale = (p_weight / total).transpose(0, 1).unsqueeze(-1)
        s_scale = (s_weight / total).transpose(0, 1).unsqueeze(-1)
        out = inputs.prefix_output.float() * p_scale + inputs.suffix_output.float() * s_scale
        lse = torch.log(total) + top
        with_context = inputs.prefill_tokens_with_context
        if with_context is not None:  # tokens past it have no prefix: their suffix is the answer
            out[with_context:] = inputs.suffix_output[with_context:].float()
            lse[:, with_context:] = s_lse[:, with_context:]
        return out.to(inputs.suffix_output.dtype), lse


def test_an_unmapped_pos_inf_is_located_with_the_inputs_there() -> None:
    oracle, port = OracleSide(), ForgetsPosInf()
    messages = []
    for case in load_suite("smoke").merge_cases:
        result = compare_merge(oracle, port, case)
        if result.status == PORT_ERROR and result.error and "NaN" in result.error:
            messages.append(result.error)
    assert messages, "no smoke merge case has a +inf LSE"
    for message in messages:
        found = re.search(
            r"first at \(token (\d+), head (\d+)(, dim (\d+))?\): oracle (\S+); inputs there: "
            r"prefix_lse (\S+), suffix_lse (\S+)",
            message,
        )
        assert found, message
        assert "inf" in (found[6] + found[7]), message
    assert any("prefix_output" in m and "suffix_output" in m for m in messages), messages
