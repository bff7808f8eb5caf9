"""Model resolution: the bundled default model, a local folder, a Hugging Face Hub id, or a GGUF file
converted once to safetensors."""
