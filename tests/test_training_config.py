"""TrainerConfig: defaults are valid, bad values are rejected with a message that says what to set."""

import re

import pytest

from lightning_sdk.training.config import DEFAULT_LORA_TARGET_MODULES, TrainerConfig


def test_defaults_are_valid_and_serialisable():
    config = TrainerConfig()
    data = config.to_dict()
    assert data["group_size"] == 8
    assert data["lora_target_modules"] == list(DEFAULT_LORA_TARGET_MODULES)
    assert data["report_to"] == []


def test_lists_are_normalised_to_tuples_and_callable_credit_is_named():
    def by_length(episode, calls):
        return [1.0] * len(calls)

    def kind(task):
        return task["kind"]

    config = TrainerConfig(
        train_agents=["planner"], report_to=["tensorboard"], credit=by_length, balance_by=kind
    )
    assert config.train_agents == ("planner",)
    assert config.to_dict()["balance_by"].endswith("kind")
    assert config.report_to == ("tensorboard",)
    assert config.to_dict()["credit"].endswith("by_length")
    assert config.to_dict()["train_agents"] == ["planner"]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"group_size": 1}, "group_size=1 leaves nothing to compare"),
        ({"group_size": 2.5}, "group_size=2.5 must be an integer"),
        ({"batch_size": 0}, "batch_size=0 is too small"),
        ({"max_steps": True}, "max_steps=True must be an integer"),
        ({"max_time_s": 0}, "max_time_s=0 must be a positive number of seconds"),
        ({"micro_batch_size": 0}, "micro_batch_size=0 is too small"),
        ({"learning_rate": -1e-4}, "a negative learning rate climbs the loss"),
        ({"learning_rate": float("nan")}, "learning_rate=nan must be a finite number"),
        ({"temperature": 0.0}, "temperature 0 is greedy"),
        ({"top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
        ({"on_error": "skip"}, "on_error='skip' is not one of ['drop', 'zero']"),
        (
            {"credit": "uniform"},
            "credit='uniform' is unknown; set one of 'equal', 'last', 'discounted', 'step' or",
        ),
        ({"credit": "discounted", "gamma": 0.0}, "gamma=0.0 must be in (0, 1]"),
        ({"train_agents": "planner("}, "is not a valid regular expression"),
        ({"train_agents": []}, "non-empty list of agent names"),
        ({"mode": "episode"}, "mode='episode' is not one of ['transition', 'trajectory']"),
        ({"loss_normalization": "ppo"}, "loss_normalization='ppo' is not one of"),
        ({"epsilon_low": 1.0}, "epsilon_low=1.0 must be in [0, 1)"),
        ({"epsilon_high": -0.1}, "epsilon_high=-0.1 must be >= 0"),
        ({"importance_sampling_cap": 0.5}, "importance_sampling_cap=0.5 must be >= 1"),
        ({"other_agents": "shared"}, "other_agents='shared' gives the agents without a role"),
        ({"kl_coef": -0.1}, "kl_coef=-0.1 is too small"),
        ({"max_grad_norm": 0.0}, "max_grad_norm=0.0 must be a positive number"),
        ({"lora_target_modules": []}, "lora_target_modules must be 'all-linear' or a non-empty list"),
        ({"lora_dropout": 1.0}, "lora_dropout=1.0 must be in [0, 1)"),
        ({"weight_sync": "nccl"}, "weight_sync='nccl' is not one of ['auto', 'merge', 'lora']"),
        ({"upstream_base_url": "api.openai.com/v1"}, "must be an http(s) base URL ending in /v1"),
        ({"report_to": ["mlflow"]}, "report_to has unknown backend(s) ['mlflow']; use 'tensorboard' and/or"),
        ({"dr_grpo_length": 0}, "dr_grpo_length=0 must be a positive integer"),
        ({"keep_checkpoints": 0}, "resuming needs the newest checkpoint"),
        (
            {"dynamic_sampling_rounds": -1},
            "dynamic_sampling_rounds=-1 is too small: 0 turns dynamic sampling off",
        ),
        ({"dynamic_sampling_rounds": 1.5}, "dynamic_sampling_rounds=1.5 must be an integer"),
        ({"dtype": "int8"}, "dtype='int8' is not one of"),
        ({"balance_by": ""}, "balance_by='' must be a task field name (a non-empty string), a function"),
        ({"balance_by": 3}, "balance_by=3 must be a task field name"),
        ({"max_sample_tokens": 1}, "max_sample_tokens=1 must be an integer >= 2"),
        ({"max_sample_tokens": 512.0}, "max_sample_tokens=512.0 must be an integer >= 2"),
        ({"episode_store_max_mb": 0}, "episode_store_max_mb=0 must be a positive number of megabytes"),
    ],
)
def test_bad_values_are_rejected_with_a_fix(kwargs, expected):
    with pytest.raises(ValueError, match=re.escape(expected)) as error:
        TrainerConfig(**kwargs)
    assert str(error.value).startswith("TrainerConfig: ")


def test_good_alternatives_are_accepted():
    config = TrainerConfig(
        group_size=2,
        credit="discounted",
        gamma=0.9,
        train_agents="planner|writer",
        mode="trajectory",
        loss_normalization="dr_grpo",
        importance_sampling_cap=None,
        max_grad_norm=None,
        lora_target_modules="all-linear",
        report_to=("tensorboard", "wandb"),
    )
    assert config.lora_target_modules == "all-linear"


def test_the_old_spelling_merged_still_works_and_says_the_new_one():
    # Runs saved before the rename keep resuming; the engine and the config now spell it the same.
    with pytest.warns(DeprecationWarning, match='"merge"'):
        config = TrainerConfig(weight_sync="merged")
    assert config.weight_sync == "merge"
