"""One-time conversion of a GGUF checkpoint into a Hugging Face safetensors folder."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["convert_gguf_to_safetensors"]


def convert_gguf_to_safetensors(gguf_file: Path, output_dir: Path) -> None:
    """Write `gguf_file` as a bfloat16 safetensors model folder with its tokenizer into `output_dir`.

    transformers de-quantizes GGUF weights to fp32 on load but refuses to `save_pretrained` a model loaded
    from GGUF, so the weights are copied into a model built from the same config. The folder is stored in
    bfloat16 (half the size; widening to float32 is exact): an engine serving in bfloat16 or float32 and a
    trainer that loads the folder in float32 start from bit-identical base weights.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    source = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    # Tied output embeddings may be absent from the source state dict; anything else means a bad conversion.
    if config.tie_word_embeddings:
        missing = [key for key in missing if key != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing}, unexpected={unexpected}")

    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(output_dir)
    _drop_quantization_config(output_dir / "config.json")


def _drop_quantization_config(config_path: Path) -> None:
    # A leftover quantization_config would make vLLM look for a GGUF quantization method.
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2))
