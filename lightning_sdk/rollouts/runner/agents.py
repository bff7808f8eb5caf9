"""`load_agent`: find a function from a `module:function` or `path/to/file.py:function` string.

Runner processes import the agent themselves, so the trainer names it by such a string: a module on the
Python path, or a script file (loaded under its own name, so its `if __name__ == "__main__":` block,
which usually starts training, does not run).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["agent_reference", "load_agent"]


def load_agent(reference: str) -> Any:
    """The object named by `module:attribute` or `file.py:attribute` (the working directory is importable)."""
    location, _, attribute = reference.rpartition(":")
    if not location or not attribute:
        raise ValueError(f"{reference!r} must look like module:function or path/to/agent.py:function.")
    if location.endswith(".py"):
        module = _load_file(Path(location))
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(location)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{location} has no attribute {attribute!r}.") from None


def agent_reference(agent: Any) -> str:
    """The string `load_agent` finds `agent` by in another process, or a `ValueError` saying why none."""
    module_name = getattr(agent, "__module__", None)
    qualname = getattr(agent, "__qualname__", "")
    if not module_name or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{agent!r} is not importable by name (defined inside a function, or a lambda): define it at the "
            "top level of a module, or name it with Runners(agent='module:function')."
        )
    if module_name == "__main__":
        file = getattr(sys.modules["__main__"], "__file__", None)
        if file is None:
            raise ValueError(
                "The agent is defined in an interactive session, which runner processes cannot import: "
                "move it "
                "into a module, or name it with Runners(agent='module:function')."
            )
        return f"{Path(file).resolve()}:{qualname}"
    return f"{module_name}:{qualname}"


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"{path} does not exist.")
    name = f"lightning_sdk_agent_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # its own imports of neighbouring modules
    spec.loader.exec_module(module)
    return module
