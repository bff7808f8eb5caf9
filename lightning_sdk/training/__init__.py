"""The trainer, cut along its flow (docs/training.md describes each stage):

- `trainer`, `config`: `Trainer.fit` and its configuration;
- `run/`: one run's machinery: starting its parts, the session that holds them, the rollouts' loop;
- `algorithm/`: episodes -> samples, pure: error policy, credit, advantages, samples, diagnostics;
- `update/`: torch: log-probabilities, micro-batches, loss, optimizer step, LoRA, checkpoints, export,
  torchrun's process group;
- `records/`: the run folder, its episode files, metrics and progress output, the report.

Running the agent lives in `lightning_sdk.rollouts`. Importing this package imports nothing heavy; `torch`,
`transformers` and `peft` load with the modules that need them.
"""

__all__: list[str] = []
