"""LoRA adapters as folders: how a saved adapter folder is recognised, and how its weights are read and
merged into a base model's (both engines, and the trainer's exports)."""
