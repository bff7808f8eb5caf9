"""train_on_samples: real optimizer steps on a tiny Llama, and on the bundled model (slow)."""

import math

import pytest
import torch

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.lora import build_lora_model, load_base_model
from lightning_sdk.training.update.optim import build_optimizer, build_scheduler
from lightning_sdk.training.update.step import train_on_samples
from tests.fixtures.training import tiny_lora_model


def lora_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def toy_samples():
    return [
        Sample([1, 2, 3], [4, 5, 6], [1, 1, 1], [-8.0, -2.5, None], [1.0] * 3),
        Sample([1, 2], [7, 8], [1, 1], [-3.0, -3.0], [-1.0] * 2),
        Sample([9], [10, 11, 12, 13], [1, 0, 0, 1], [-1.0, None, None, -4.0], [0.5, 0, 0, 0.5]),
    ]


def train_tiny(samples, **kwargs):
    model, config = tiny_lora_model(learning_rate=1e-2, **kwargs)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    before = lora_weights(model)
    stats = train_on_samples(model, optimizer, scheduler, samples, config)
    return model, before, stats


def test_one_step_moves_the_lora_weights_and_reports_stats():
    model, before, stats = train_tiny(toy_samples())
    after = lora_weights(model)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert stats["optimizer_steps"] == 1 and stats["skipped_updates"] == 0
    assert stats["trained_sequences"] == 3 and stats["trained_tokens"] == 7
    assert stats["micro_batch_tokens_max"] == 3 * (3 + 4)  # padded on a CPU: rows x (prompt + completion)
    assert stats["clip_fraction"] == 0.0  # fully on-policy: the ratio is exactly 1
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert math.isfinite(stats["grad_norm"]) and stats["entropy"] > 0
    # The toy "engine" gave token 4 logprob -8, far below the model's (about -4 over 64 tokens): capped.
    assert stats["importance_ratio_max"] > 2.0 and stats["importance_capped_fraction"] > 0
    assert stats["learning_rate"] == pytest.approx(1e-2)


def test_micro_batch_size_does_not_change_the_update():
    one_by_one, _, _ = train_tiny(toy_samples(), micro_batch_size=1)
    all_at_once, _, _ = train_tiny(toy_samples(), micro_batch_size=8)
    for name, value in lora_weights(one_by_one).items():
        assert torch.allclose(value, lora_weights(all_at_once)[name], atol=1e-6), name


def test_several_mini_batches_and_the_kl_term():
    _, _, stats = train_tiny(toy_samples(), mini_batches_per_step=2, kl_coef=0.1)
    assert stats["optimizer_steps"] == 2
    assert stats["kl"] > 0  # the adapter (non-zero B) makes the policy differ from the base model
    assert stats["ratio_mean"] != 1.0  # the second mini-batch is measured against the pre-update policy


def test_a_non_finite_gradient_skips_the_update():
    bad = [Sample([1, 2], [3], [1], [None], [math.inf])]
    model, before, stats = train_tiny(bad)
    assert stats["skipped_updates"] == 1 and stats["optimizer_steps"] == 0
    assert all(torch.equal(before[name], value) for name, value in lora_weights(model).items())


def test_no_samples_means_no_update():
    stats = train_tiny([])[2]
    assert stats["optimizer_steps"] == 0 and stats["trained_sequences"] == 0


@pytest.mark.slow
def test_bundled_model_learns_from_advantages(bundled_model_path):
    """Real model, real sampled tokens: the positive-advantage completion becomes likelier, the negative
    one less."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path))
    config = TrainerConfig(learning_rate=2e-4, micro_batch_size=2, max_grad_norm=1.0)
    model = build_lora_model(load_base_model(bundled_model_path, dtype=config.dtype), config)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 7? Reply with only the number."}],
        add_generation_prompt=True,
        return_dict=False,
    )
    with torch.no_grad(), model.disable_adapter():
        generated = model.generate(
            torch.tensor([prompt, prompt]),
            attention_mask=torch.ones(2, len(prompt), dtype=torch.long),
            do_sample=True,
            max_new_tokens=8,
            temperature=1.0,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
        )
    completions = [row[len(prompt) :].tolist() for row in generated]
    samples = [
        Sample(list(prompt), ids, [1] * len(ids), [None] * len(ids), [advantage] * len(ids))
        for ids, advantage in zip(completions, (1.0, -1.0), strict=True)
    ]

    def sequence_logprobs(layout=None):
        batch = collate(samples, tokenizer.pad_token_id)
        with torch.no_grad():
            values, _ = token_logprobs(model, batch, with_entropy=False, layout=layout)
        return [float((values[row] * batch.loss_mask[row]).sum()) for row in range(2)]

    start = sequence_logprobs()
    # The two samples share their prompt: one prompt pass reused by both gives the same numbers.
    assert start == pytest.approx(sequence_logprobs(layout="padded"), abs=1e-3)
    before = lora_weights(model)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    for _ in range(2):
        stats = train_on_samples(model, optimizer, scheduler, samples, config, tokenizer.pad_token_id)
        assert stats["optimizer_steps"] == 1 and math.isfinite(stats["loss"])
    end = sequence_logprobs()
    after = lora_weights(model)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert end[0] > start[0] + 0.5, (start, end)
    assert end[1] < start[1] - 0.5, (start, end)


def _ddp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        model, config = tiny_lora_model(learning_rate=1e-2, micro_batch_size=1)
        wrapped = DistributedDataParallel(model)
        optimizer = build_optimizer(model, config)
        scheduler = build_scheduler(optimizer, config)
        samples = toy_samples()[:2] if rank == 0 else toy_samples()[2:] * 2
        train_on_samples(wrapped, optimizer, scheduler, samples, config)
        torch.save(lora_weights(model), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_ranks_stay_in_sync(tmp_path, unused_tcp_port):
    """Two gloo ranks train on different samples; all-reduced gradients keep their adapters identical."""
    import torch.multiprocessing as mp

    mp.start_processes(_ddp_worker, args=(unused_tcp_port, str(tmp_path)), nprocs=2, start_method="spawn")
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    alone, before, _ = train_tiny(toy_samples()[:2], micro_batch_size=1)
    for name, value in rank0.items():
        assert torch.allclose(value, rank1[name], atol=1e-6), name
    assert any(not torch.equal(before[name], rank0[name]) for name in before)
    # Rank 0 alone would have moved differently: the update really mixes both ranks' gradients.
    assert any(
        not torch.allclose(rank0[name], value, atol=1e-6) for name, value in lora_weights(alone).items()
    )


def test_a_float16_policy_trains_with_a_dynamic_loss_scale():
    from lightning_sdk.training.update.loss_scale import INITIAL_SCALE

    model, config = tiny_lora_model(learning_rate=1e-2)
    model.base_model.model.to(torch.float16)  # the base in float16, as TrainerConfig(dtype="float16")
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            parameter.data = parameter.data.float()  # peft keeps adapters in float32 on a half base
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    before = lora_weights(model)
    stats = train_on_samples(model, optimizer, scheduler, toy_samples(), config)
    assert stats["optimizer_steps"] == 1 and math.isfinite(stats["grad_norm"])
    assert any(not torch.equal(before[name], value) for name, value in lora_weights(model).items())
    group = optimizer.param_groups[0]
    assert group["loss_scale"] == INITIAL_SCALE and group["loss_scale_good_steps"] == 1
    # A scale that overflows float16's gradients skips the update and is halved; the weights stay.
    group["loss_scale"] = 1e38
    kept = lora_weights(model)
    stats = train_on_samples(model, optimizer, scheduler, toy_samples(), config)
    assert stats["skipped_updates"] == 1 and group["loss_scale"] == 5e37
    assert all(torch.equal(kept[name], value) for name, value in lora_weights(model).items())
    assert "loss_scale" in optimizer.state_dict()["param_groups"][0]  # saved with every checkpoint


def test_a_float32_policy_has_no_loss_scale():
    model, config = tiny_lora_model()
    optimizer = build_optimizer(model, config)
    stats = train_on_samples(model, optimizer, build_scheduler(optimizer, config), toy_samples(), config)
    assert "loss_scale" not in optimizer.param_groups[0] and stats["optimizer_steps"] == 1
