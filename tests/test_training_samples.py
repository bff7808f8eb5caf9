"""Samples and masks: transition samples, trajectory merging, padding."""

import pytest
import torch

from lightning_sdk.tracing.episode import LLMCall
from lightning_sdk.training.algorithm.samples import Sample, build_samples, chain_calls
from lightning_sdk.training.update.forward.batching import batch_tokens, collate, micro_batches


def call(prompt, completion, logprobs=None, agent="a"):
    if logprobs is None:
        logprobs = [-0.1 * (index + 1) for index in range(len(completion))]
    return LLMCall(
        prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs, agent_name=agent
    )


def test_transition_mode_makes_one_fully_trained_sample_per_credited_call():
    calls = [call([1, 2], [3, 4]), call([5], [6]), call([7], [8])]
    samples = build_samples(calls, [0.5, None, -1.0], episode_id="e1", temperature=0.7)
    assert [sample.input_ids for sample in samples] == [[1, 2, 3, 4], [7, 8]]
    first = samples[0]
    assert first.loss_mask == [1, 1]
    assert first.advantages == [0.5, 0.5]
    assert first.sampling_logprobs == [-0.1, -0.2]
    assert first.call_ids == [calls[0].id]
    assert (first.episode_id, first.agent_name, first.temperature) == ("e1", "a", 0.7)


def test_trajectory_mode_merges_extending_calls_and_masks_unsampled_tokens():
    # Turn 1: prompt [1, 2] -> sampled [3, 4]. Tool output [9, 9] and template token [5] are appended by
    # the agent, turn 2 samples [6]. Turn 3 re-renders history differently ([1, 2, 3, 7]): new chain.
    first = call([1, 2], [3, 4], [-0.1, -0.2])
    second = call([1, 2, 3, 4, 9, 9, 5], [6], [-0.3])
    third = call([1, 2, 3, 7], [8], [-0.4])
    samples = build_samples([first, second, third], [1.0, 2.0, 3.0], "e", mode="trajectory")
    merged, alone = samples
    assert merged.prompt_ids == [1, 2]
    assert merged.completion_ids == [3, 4, 9, 9, 5, 6]
    assert merged.loss_mask == [1, 1, 0, 0, 0, 1]
    assert merged.advantages == [1.0, 1.0, 0.0, 0.0, 0.0, 2.0]
    assert merged.sampling_logprobs == [-0.1, -0.2, None, None, None, -0.3]
    assert merged.call_ids == [first.id, second.id]
    assert alone.input_ids == [1, 2, 3, 7, 8] and alone.loss_mask == [1]


@pytest.mark.parametrize("mode", ["transition", "trajectory"])
def test_tokens_a_grammar_forced_are_not_trained(mode):
    # A structured-output call: '{' and '"' forced by the JSON grammar (logprob 0), the rest chosen.
    constrained = call([1, 2], [3, 4, 5, 6], [0.0, -0.0, -0.7, -1e-9])
    constrained.sampling = {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}
    free = call([1, 2], [3, 4], [0.0, -0.5])  # an unconstrained call's confident token is still trained
    (structured,) = build_samples([constrained], [1.0], "e", mode=mode)
    assert structured.loss_mask == [0, 0, 1, 0]
    assert structured.sampling_logprobs == [0.0, -0.0, -0.7, -1e-9]
    (plain,) = build_samples([free], [1.0], "e", mode=mode)
    assert plain.loss_mask == [1, 1]


def test_untrained_calls_stay_in_a_trajectory_as_context():
    first = call([1], [2, 3])
    second = call([1, 2, 3, 4], [5])
    (sample,) = build_samples([first, second], [None, 0.5], "e", mode="trajectory")
    assert sample.completion_ids == [2, 3, 4, 5]
    assert sample.loss_mask == [0, 0, 0, 1]
    assert sample.sampling_logprobs == [None, None, None, -0.1]


def test_interleaved_agents_form_separate_chains():
    a1, b1 = call([1], [2], agent="a"), call([7], [8], agent="b")
    a2, b2 = call([1, 2, 3], [4], agent="a"), call([7, 8, 9], [10], agent="b")
    assert chain_calls([a1, b1, a2, b2]) == [[0, 2], [1, 3]]


def test_missing_or_mismatched_engine_logprobs_become_none():
    samples = build_samples([call([1], [2, 3], logprobs=[-0.5])], [1.0], "e")
    assert samples[0].sampling_logprobs == [None, None]


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="2 advantages for 1 calls"):
        build_samples([call([1], [2])], [1.0, 2.0], "e")
    with pytest.raises(ValueError, match="greedy calls cannot be trained"):
        build_samples([call([1], [2])], [1.0], "e", temperature=0.0)
    with pytest.raises(ValueError, match="one entry per completion token"):
        Sample(prompt_ids=[1], completion_ids=[2], loss_mask=[], sampling_logprobs=[None], advantages=[1.0])


def test_collate_stores_each_prompt_once_left_padded_and_completions_right_padded():
    long = Sample([1, 2, 3], [4, 5], [1, 1], [-0.1, -0.2], [1.0, 1.0])
    short = Sample([6], [7, 8, 9], [1, 0, 1], [-0.3, None, None], [-1.0, 0.0, -1.0], temperature=0.5)
    again = Sample([1, 2, 3], [10], [1], [-0.4], [2.0])
    batch = collate([long, short, again], pad_token_id=0)
    assert batch.prompt_ids.tolist() == [[1, 2, 3], [0, 0, 6]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.prompt_index.tolist() == [0, 1, 0]
    assert (batch.num_prompts, batch.num_sequences) == (2, 3)
    assert batch.completion_ids.tolist() == [[4, 5, 0], [7, 8, 9], [10, 0, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 0]]
    assert batch.advantages.tolist() == [[1, 1, 0], [-1, 0, -1], [2, 0, 0]]
    expected_logprobs = torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-0.4, 0, 0]])
    assert torch.allclose(batch.sampling_logprobs, expected_logprobs)
    assert batch.has_sampling_logprobs.tolist() == [
        [True, True, False],
        [True, False, False],
        [True, False, False],
    ]
    assert batch.temperatures.tolist() == [1.0, 0.5, 1.0]


def test_micro_batches_pack_whole_prompt_groups():
    def group(prompt, lengths):
        return [Sample(prompt, [1] * n, [1] * n, [None] * n, [1.0] * n) for n in lengths]

    small, medium, large = group([1], [1, 2]), group([5, 5], [3, 1, 2]), group([7, 7, 7], [1, 1, 1, 1, 1])
    chunks = micro_batches(large + medium + small, 4)
    # [1]'s two samples; [5, 5]'s three do not fit beside them; [7, 7, 7]'s five are split 4 + 1.
    assert [[sample.prompt_ids for sample in chunk] for chunk in chunks] == [
        [[1]] * 2,
        [[5, 5]] * 3,
        [[7, 7, 7]] * 4,
        [[7, 7, 7]],
    ]
    assert [len(sample.completion_ids) for sample in chunks[1]] == [1, 2, 3]
    assert [collate(chunk).num_prompts for chunk in chunks] == [1, 1, 1, 1]


def test_micro_batches_keep_within_the_token_budget_and_a_long_sample_goes_alone():
    def sample(prompt, length):
        return Sample(prompt, [1] * length, [1] * length, [None] * length, [1.0] * length)

    group = [sample([3, 3], length) for length in (2, 4, 6)]  # padded: rows x (2 + longest completion)
    long = sample([9], 40)
    chunks = micro_batches([*group, long], size=8, max_tokens=16)
    assert [[len(s.completion_ids) for s in chunk] for chunk in chunks] == [[40], [2, 4], [6]]
    assert batch_tokens(chunks[0]) == 41 and all(batch_tokens(chunk) <= 16 for chunk in chunks[1:])
    assert micro_batches([*group, long], size=8) == [[long, *group]]  # no budget: one pass
