"""Metrics: metrics.jsonl lines, resume truncation, TensorBoard files, missing W&B, progress line."""

import importlib.util
import io
import json
import math

import pytest

from lightning_sdk.training.records.metrics import (
    EvaluationProgress,
    MetricsWriter,
    ProgressBar,
    read_metrics,
)


def test_one_flushed_json_line_per_step(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.log(1, {"reward_mean": 0.25, "kl": math.nan, "skipped_groups": {"no_spread": 2}})
    # Flushed: readable before close, as after a kill.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert record["step"] == 1 and record["reward_mean"] == 0.25
    assert record["kl"] is None  # JSON has no NaN
    assert record["skipped_groups"] == {"no_spread": 2}
    writer.log(2, {"reward_mean": 0.5})
    writer.close()
    assert [r["reward_mean"] for r in read_metrics(tmp_path)] == [0.25, 0.5]


def test_resume_drops_records_after_the_checkpoint_and_skips_a_torn_line(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for step in (1, 2, 3):
            writer.log(step, {"reward_mean": step / 10})
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 4, "rew')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    with MetricsWriter(tmp_path, resume_step=2) as writer:
        assert [r["step"] for r in writer.history] == [1, 2]
        writer.log(3, {"reward_mean": 0.9})
    assert [(r["step"], r["reward_mean"]) for r in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.9)]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_events_are_written(tmp_path):
    with MetricsWriter(tmp_path, report_to=["tensorboard"]) as writer:
        writer.log(1, {"reward_mean": 0.5, "note": "text is not a scalar"})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_missing_wandb_says_how_to_install_it(tmp_path):
    with pytest.raises(
        ImportError, match=r"pip install wandb.*or remove 'wandb' from TrainerConfig.report_to"
    ):
        MetricsWriter(tmp_path, report_to=["wandb"])


def test_progress_line_shows_step_reward_and_speed():
    stream = io.StringIO()
    bar = ProgressBar(total=10, enabled=True, stream=stream)
    text = bar.update(1, {"reward_mean": 0.125, "loss": float("nan")})
    bar.close()
    assert text.startswith("reward=0.125 ") and text.endswith("s/step") and "loss" not in text
    assert "1/10" in stream.getvalue()
    assert ProgressBar(total=3, enabled=False).update(1, {"val_reward_mean": 0.5}).startswith("val=0.500")
    counts = {"reward_mean": 0.5, "groups_with_signal": 3, "groups_rolled_out": 8}
    assert " signal=3/8 " in ProgressBar(total=3, enabled=False).update(1, counts)
    # The engine-against-trainer gap shows only when it is high (MISMATCH_HIGH, 0.005 nats per token).
    assert "gap=" not in ProgressBar(total=3, enabled=False).update(1, {"mismatch_logratio_abs": 3e-6})
    assert "gap=0.023 " in ProgressBar(total=3, enabled=False).update(1, {"mismatch_logratio_abs": 0.023})
    # Rollouts through the update (max_staleness >= 1): staleness, groups too old and in flight, busy share.
    overlapped = {
        "staleness_mean": 0.62,
        "groups_too_old": 1.0,
        "groups_in_flight": 5,
        "engine_busy_share": 0.46,
    }
    assert "stale=0.6 old=1 flight=5 busy=46% " in ProgressBar(total=3, enabled=False).update(1, overlapped)
    assert "flight" not in ProgressBar(total=3, enabled=False).update(1, {"engine_busy_share": 0.3})


def test_the_gap_warning_names_the_cause_it_can_see_once(caplog):
    from lightning_sdk.training.records.policy_gap import mismatch_warning
    from lightning_sdk.training.run.run_warnings import RunWarnings

    high = {"mismatch_logratio_abs": 0.023, "mismatch_tail_share": 0.002, "mismatch_signal_removed": 0.008}
    apart = mismatch_warning(2, high, "bfloat16", "float32")
    assert "0.023 nats" in apart and "0.2% of tokens" in apart and "0.8% of the update's" in apart
    assert "engine serves in bfloat16, the policy trains in float32" in apart and "dtype='float32'" in apart
    assert "TrainerConfig(dtype='float16')" in mismatch_warning(2, high, "bfloat16", "bfloat16")
    assert "top_p" in mismatch_warning(2, high, "float32", "float32")
    warnings = RunWarnings()
    with caplog.at_level("INFO", logger="lightning_sdk.training"):
        warnings.policy_gap(1, {"mismatch_logratio_abs": 2e-6}, "float32", "float32")  # float32's own level
        warnings.policy_gap(2, high, "bfloat16", "float32")
        warnings.policy_gap(3, high, "bfloat16", "float32")
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert caplog.records[0].getMessage().startswith("step 2: ")
    caplog.clear()
    with caplog.at_level("INFO", logger="lightning_sdk.training"):  # a GPU's default: said, not warned
        RunWarnings().policy_gap(1, high, "bfloat16", "bfloat16")
    assert [record.levelname for record in caplog.records] == ["INFO"]


def test_evaluation_progress_counts_episodes_then_shows_the_result():
    stream = io.StringIO()
    progress = EvaluationProgress(step=4, total=3, stream=stream)
    for _ in range(3):
        progress.episode_done()
    line = progress.finish({"reward": 0.5, "success_rate": 0.25, "episodes": 3.0, "episodes_failed": 1.0})
    assert line == "held-out (step 4): reward 0.500, success 25% of 3 tasks, 1 failed"
    shown = stream.getvalue()
    assert "evaluating after step 4" in shown and "/3 " in shown  # a counter of the 3 tasks
    assert shown.endswith(line + "\n")  # the result stays on screen, the counter does not
    base = EvaluationProgress(step=0, total=2, enabled=False)
    base.episode_done()
    assert base.finish({"reward": 0.0, "success_rate": 0.0, "episodes": 2.0}) == (
        "held-out (base model): reward 0.000, success 0% of 2 tasks"
    )


def test_an_engine_in_another_dtype_than_the_policy_is_named_at_the_start(caplog):
    from lightning_sdk.training.run.run_warnings import warn_if_dtypes_differ

    with caplog.at_level("WARNING", logger="lightning_sdk.training"):
        warn_if_dtypes_differ("float32", "float32", "the engine passed to fit")
        warn_if_dtypes_differ(None, "float32", "an engine that does not say")
        warn_if_dtypes_differ("bfloat16", "float32", "the engine passed to fit")
    [record] = caplog.records
    assert record.getMessage().startswith("the engine passed to fit serves in bfloat16 while the policy")
    assert "build it with dtype='float32'" in record.getMessage()
