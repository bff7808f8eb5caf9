"""Model resolution: bundled model conversion and caching, local folders, unreachable Hub ids."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lightning_sdk.engine import BUNDLED_MODEL_NAME, ModelNotFoundError, cache_dir, resolve_model


def test_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LIGHTNING_SDK_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LIGHTNING_SDK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "lightning-sdk"


@pytest.mark.slow
def test_bundled_model_is_a_complete_cached_folder(bundled_model) -> None:
    folder = bundled_model.path
    assert bundled_model.name == BUNDLED_MODEL_NAME
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    # No staging folder of an interrupted or concurrent conversion is left next to it.
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]
    started = time.perf_counter()
    assert resolve_model(None) == bundled_model
    assert time.perf_counter() - started < 1.0  # reused, not converted again


@pytest.mark.slow
def test_bundled_tokenizer_keeps_the_chat_template(bundled_model) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model.path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_local_folder_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    resolved = resolve_model(tmp_path)
    assert resolved.path == tmp_path.resolve()
    assert resolved.name == tmp_path.name


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve_model(tmp_path)


def test_missing_path_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(tmp_path / "nothing" / "here")


def test_unreachable_hub_suggests_the_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # The Hub is remote: make it unreachable the way an air-gapped machine sees it.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError, match="unreachable") as raised:
        resolve_model("HuggingFaceTB/some-model-that-is-not-cached")
    assert "model=None" in str(raised.value)
