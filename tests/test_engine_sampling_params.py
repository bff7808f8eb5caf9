"""SamplingParams rejects out-of-range values with a message naming the field and the accepted range."""

from __future__ import annotations

import pytest

from lightning_sdk.engine import PromptTooLongError, SamplingParams
from lightning_sdk.engine.types import check_prompt_fits


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_tokens", 0, ">= 1"),
        ("temperature", -0.1, "between 0 and 2"),
        ("temperature", float("nan"), "between 0 and 2"),
        ("top_p", 0.0, "(0, 1]"),
        ("n", 17, "between 1 and 16"),
        ("stop", ("",), "non-empty"),
        ("top_logprobs", 21, "between 0 and 20"),
        ("presence_penalty", 2.5, "between -2 and 2"),
        ("frequency_penalty", float("nan"), "between -2 and 2"),
        # torch generators overflow past 64 bits; caught here, not as a failed engine step
        ("seed", 2**64, "fits in 64 bits"),
        ("seed", -(2**63) - 1, "fits in 64 bits"),
        ("seed", True, "fits in 64 bits"),
    ],
)
def test_invalid_values_are_rejected(field: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=f"Invalid {field}=") as raised:
        SamplingParams(**{field: value})
    assert expected in str(raised.value)


def test_64_bit_seeds_are_accepted() -> None:
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_defaults_and_greedy() -> None:
    params = SamplingParams(temperature=0, stop=["\n"])
    assert params.greedy
    assert params.stop == ("\n",)
    assert not SamplingParams().greedy


def test_prompt_must_fit_the_context() -> None:
    check_prompt_fits(10, 10, 20)
    with pytest.raises(PromptTooLongError, match="maximum context length is 20"):
        check_prompt_fits(11, 10, 20)
    with pytest.raises(ValueError, match="empty"):
        check_prompt_fits(0, 10, 20)
