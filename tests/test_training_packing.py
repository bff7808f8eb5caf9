"""The packed training pass: each prompt once, no padding, the same numbers as the padded pass."""

import json
import logging

import pytest
import torch

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.forward.batching import batch_tokens, collate, micro_batches
from lightning_sdk.training.update.forward.logprobs import default_layout, token_logprobs
from lightning_sdk.training.update.forward.packed_attention import (
    attention_implementation,
    head_dim_problem,
    packed_attention_mask,
    packing_problem,
)
from lightning_sdk.training.update.forward.packing import pack
from lightning_sdk.training.update.lora import build_lora_model
from tests.fixtures.runs import run_script
from tests.fixtures.training import tiny_llama, tiny_lora_model


def sample(prompt, completion, loss_mask=None, temperature=1.0):
    size = len(completion)
    mask = loss_mask if loss_mask is not None else [1] * size
    return Sample(list(prompt), list(completion), mask, [None] * size, [1.0] * size, temperature=temperature)


def test_the_row_holds_each_prompt_once_and_each_completion_after_it():
    # The docstring's example: prompt P (3 tokens) with samples a and b, prompt Q (2 tokens) with c.
    samples = [sample([1, 2, 3], [4, 5]), sample([9, 8], [7, 6, 5, 4]), sample([1, 2, 3], [6, 7, 8])]
    row = pack(collate(samples))
    assert row.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 8, 7, 6, 5, 4]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 2, 3, 4, 5]]
    # Completion token 0 is predicted by the prompt's last token, token k by completion token k - 1.
    assert row.predictors.tolist() == [2, 3, 2, 5, 6, 9, 10, 11, 12]
    assert row.targets.tolist() == [4, 5, 6, 7, 8, 7, 6, 5, 4]
    assert row.rows.tolist() == [0, 0, 2, 2, 2, 1, 1, 1, 1]
    assert row.columns.tolist() == [0, 1, 0, 1, 2, 0, 1, 2, 3]
    allowed = row.allowed()
    sees = {query: [key for key in range(row.length) if allowed[query, key]] for query in range(row.length)}
    assert sees[2] == [0, 1, 2]  # a prompt token: its prompt, causally
    assert sees[4] == [0, 1, 2, 3, 4]  # sample a: the prompt and itself
    assert sees[6] == [0, 1, 2, 5, 6]  # sample b: the prompt and itself, not a
    assert sees[9] == [8, 9]  # Q sees nothing of P
    assert sees[13] == [8, 9, 10, 11, 12, 13]
    assert batch_tokens(samples, packed=True) == row.length == 14
    assert batch_tokens(samples) == 3 * (3 + 4)  # padded: rows x (longest prompt + longest completion)


def mixed_samples():
    """Two prompts shared by several samples, one prompt alone, a multi-turn sample whose completion has
    untrained tokens (a tool result) between trained ones, different lengths and temperatures."""
    return [
        sample([5, 6, 7, 8], [9, 10, 11], temperature=0.7),
        sample([5, 6, 7, 8], [12, 13], temperature=0.7),
        sample([5, 6, 7, 8], [14, 15, 16, 17, 18], temperature=0.7),
        sample([21], [22, 23, 24], temperature=1.0),
        sample([30, 31], [32, 33, 40, 41, 42, 34, 35], [1, 1, 0, 0, 0, 1, 1], temperature=0.9),
        sample([30, 31], [36], temperature=0.9),
    ]


def run(model, batch, layout, chunk_tokens=2, backward=True):
    logprobs, entropy = token_logprobs(model, batch, layout=layout, chunk_tokens=chunk_tokens)
    gradients = {}
    if backward:
        (logprobs * batch.loss_mask).sum().backward()
        gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    mask = batch.completion_mask.bool()
    return logprobs.detach()[mask], entropy[mask], gradients


def assert_same(expected, actual, tolerance=1e-5):
    assert torch.allclose(expected[0], actual[0], atol=tolerance)
    assert torch.allclose(expected[1], actual[1], atol=tolerance)
    assert expected[2].keys() == actual[2].keys()
    for name, gradient in expected[2].items():
        assert torch.allclose(gradient, actual[2][name], atol=tolerance), name


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk_tokens", [2, None])
def test_packed_equals_padded_in_values_entropies_and_gradients(attention, chunk_tokens):
    results = {}
    for layout in ("padded", "packed"):
        model, _ = tiny_lora_model()
        model.get_base_model().set_attn_implementation(attention)
        results[layout] = run(model, collate(mixed_samples()), layout, chunk_tokens)
    assert results["padded"][2]  # the LoRA weights got gradients
    assert_same(results["padded"], results["packed"])


def test_one_sequence_runs_without_a_mask_and_equals_padded():
    results = {}
    for layout in ("padded", "packed"):
        model, _ = tiny_lora_model()
        results[layout] = run(model, collate(mixed_samples()[4:5]), layout)  # the multi-turn sample alone
    assert_same(results["padded"], results["packed"])


def test_packed_equals_padded_under_gradient_checkpointing():
    results = {}
    for layout in ("padded", "packed"):
        model, _ = tiny_lora_model(gradient_checkpointing=True)
        model.train()
        results[layout] = run(model, collate(mixed_samples()), layout)
    assert_same(results["padded"], results["packed"])


def test_packed_equals_padded_for_the_active_role_adapter():
    results = {}
    for layout in ("padded", "packed"):
        model, config = tiny_lora_model()
        model = build_lora_model(tiny_llama(), config, adapters=["planner", "solver"])
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.full_like(parameter, 0.05 if "planner" in name else -0.05))
        model.set_adapter("solver")
        results[layout] = run(model, collate(mixed_samples()), layout)
    assert results["padded"][2] and all("solver" in name for name in results["padded"][2])
    assert_same(results["padded"], results["packed"])


def test_flex_attention_takes_the_same_rule():
    # Flex attention has no backward pass on a CPU: the rule's values are checked here, the gradients on
    # a GPU (scripts/gpu_check.sh).
    results = {}
    for layout in ("padded", "packed"):
        model, _ = tiny_lora_model()
        model.get_base_model().set_attn_implementation("flex_attention")
        with torch.no_grad():
            results[layout] = run(model, collate(mixed_samples()), layout, backward=False)
    assert_same(results["padded"], results["packed"])
    row = pack(collate(mixed_samples()))
    block_mask = packed_attention_mask(row, "flex_attention", torch.float32)
    dense = block_mask.to_dense()  # which 128 x 128 blocks are computed: one here, the row is short
    assert dense.shape[-1] == 1 and bool(dense.all())


def test_a_model_that_cannot_pack_runs_padded_and_says_why_once(caplog):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
    )
    model = Qwen2ForCausalLM(config).eval()
    assert "sliding-window" in packing_problem(model)
    # Mistral applies its window from `sliding_window` alone (no per-layer types).
    mistral = MistralForCausalLM(MistralConfig(**{**config.to_dict(), "model_type": "mistral"}))
    assert "sliding-window" in packing_problem(mistral)
    batch = collate(mixed_samples())
    assert default_layout(model, batch) == "cached"  # a CPU model that keeps a cache still shares prompts
    with (
        caplog.at_level(logging.WARNING, logger="lightning_sdk.training.update.forward.logprobs"),
        torch.no_grad(),
    ):
        asked = run(model, batch, "packed", backward=False)
        run(model, batch, "packed", backward=False)
        padded = run(model, batch, "padded", backward=False)
    said = [record.getMessage() for record in caplog.records if "padded, not packed" in record.getMessage()]
    assert len(said) == 1 and "sliding-window" in said[0]
    assert_same(padded, asked)


def test_samples_with_nothing_to_predict_give_empty_rows():
    batch = collate([sample([1, 2], []), sample([1, 2], [])])
    logprobs, entropy = token_logprobs(tiny_llama(), batch, layout="packed")
    assert logprobs.shape == entropy.shape == (2, 0)


def test_the_cached_layout_is_refused_where_the_cache_would_be_dropped():
    model, _ = tiny_lora_model(gradient_checkpointing=True)
    with pytest.raises(ValueError, match="layout='cached' needs a model without gradient checkpointing"):
        token_logprobs(model, collate(mixed_samples()), layout="cached")
    assert default_layout(model, collate(mixed_samples())) == "packed"  # on a CPU without a cache


def test_packed_micro_batches_count_each_prompt_once_and_a_long_sample_goes_alone():
    group = [sample(range(100), range(10)) for _ in range(8)]  # 8 samples sharing a 100-token prompt
    assert batch_tokens(group, packed=True) == 100 + 8 * 10
    assert batch_tokens(group) == 8 * 110
    assert micro_batches(group, None, 200, packed=True) == [group]
    assert [len(chunk) for chunk in micro_batches(group, None, 200)] == [1] * 8
    longer = sample(range(500), range(10))
    chunks = micro_batches([*group, longer], None, 200, packed=True)
    assert [len(chunk) for chunk in chunks] == [8, 1] and chunks[1] == [longer]


def test_packed_chunks_keep_no_whole_vocabulary_tensor_for_the_backward_pass():
    vocabulary = 96  # a size no other tensor of the tiny model has
    model = build_lora_model(tiny_llama(vocab_size=vocabulary), TrainerConfig(lora_rank=4))
    batch = collate(mixed_samples())
    tokens = int(batch.completion_mask.sum())
    for chunk_tokens, expect_logits in ((None, True), (4, False)):
        saved: list[torch.Size] = []

        def keep_shape(tensor: torch.Tensor, saved: list[torch.Size] = saved) -> torch.Tensor:
            saved.append(tensor.shape)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep_shape, lambda tensor: tensor):
            token_logprobs(model, batch, with_entropy=False, layout="packed", chunk_tokens=chunk_tokens)
        logits = [
            shape for shape in saved if shape[-1] == vocabulary and shape.numel() >= tokens * vocabulary
        ]
        assert bool(logits) == expect_logits, (chunk_tokens, logits)


def test_fused_kernels_leave_the_pass_unchanged_where_they_do_not_apply():
    # On a CPU (and on a GPU without liger-kernel) the policy is the model as transformers built it.
    from lightning_sdk.training.update.forward.fused_kernels import apply_fused_kernels

    model, plain = tiny_llama(), tiny_llama()
    forwards = {name: type(module).forward for name, module in model.named_modules()}
    assert apply_fused_kernels(model) is None
    assert {name: type(module).forward for name, module in model.named_modules()} == forwards
    assert all("forward" not in vars(module) for module in model.modules())  # no instance patch either
    batch = collate(mixed_samples())
    with torch.no_grad():
        assert_same(
            run(plain, batch, "packed", backward=False), run(model, batch, "packed", backward=False), 0
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention's backward pass runs on GPUs only")
@pytest.mark.parametrize("attention", ["flex_attention", "sdpa"])
def test_packed_equals_padded_on_a_gpu_with_gradients(attention):
    # Run by scripts/gpu_check.sh on a GPU machine; skipped elsewhere.
    results = {}
    for layout in ("padded", "packed"):
        # Flex attention's GPU kernels need a head dimension of at least 16: 64 / 4 heads. The attention is
        # chosen when the model is built, as `load_base_model` does; set afterwards on the H200 (torch 2.11,
        # transformers 5.17) the "sdpa" case still ran flex attention in the checkpointed recomputation.
        config = TrainerConfig(lora_rank=4, gradient_checkpointing=True)
        base = tiny_llama(attention=attention, hidden_size=64, intermediate_size=96)
        assert base.config.head_dim == 16
        model = build_lora_model(base, config).cuda().train()
        assert attention_implementation(model) == attention
        results[layout] = run(model, collate(mixed_samples(), device="cuda"), layout)
    assert results["padded"][2]
    assert_same(results["padded"], results["packed"], tolerance=1e-4)


ON_A_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention's backward is GPU-only"),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_A_GPU)])
def test_flex_attention_compiles_at_most_twice_whatever_the_packed_length(device):
    # torch.compile recompiles flex attention at most 8 times per process, then falls back to an unfused
    # implementation that holds the whole [heads, T, T] score matrix: on the H200 that was 28 GiB per layer
    # at 16k tokens, and an out-of-memory error (benchmarks/results/gpu_check_h200_2026-11-27_rerun.md).
    # Every micro-batch of a run packs to a new length, so the pass must compile once for the first
    # shape and once with dynamic shapes, never per length. Counted in a fresh process
    # (`tests/scripts/flex_compiles.py`); the fallback's own warning is shown once per process, so the
    # count is what is checked.
    compiled = json.loads(run_script("flex_compiles.py", device, timeout=600))["compiled"]
    assert 1 <= compiled <= 2, f"flex attention compiled {compiled} times for 6 packed lengths"


def test_flex_attention_is_refused_below_its_smallest_head_dimension():
    # The H200 check failed on a head dimension of 8; "auto" now takes SDPA for such a model at load.
    assert "head dimension 8 is below flex attention's 16" in head_dim_problem(tiny_llama().config)
    assert head_dim_problem(tiny_llama(hidden_size=64).config) is None
