"""torch's memory and module trackers, imported without the package `__init__` that holds them.

`torch.distributed._tools/__init__.py` imports every tool the package ships, the runtime and
activation-checkpointing estimators among them, which import TorchDynamo and Inductor: about
2.5 s of CPU in every rank at start, for tools no rank uses (the harness needs MemTracker,
ModTracker and one storage helper, none of which imports them). The package is therefore put in
`sys.modules` as a plain package object over the same folder, so that its submodules load alone.
Anyone who asks the package itself for a name (`from torch.distributed._tools import
RuntimeEstimator`) still gets it: the first such lookup runs the real `__init__` in place.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

PACKAGE = "torch.distributed._tools"


def _package_without_init() -> None:
    """Register PACKAGE unexecuted, unless something imported it already (then nothing to gain)."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)  # imports torch.distributed, not the package itself
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not the torch this was written for: let the ordinary import run
    package = types.ModuleType(PACKAGE)
    package.__spec__ = spec
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = PACKAGE
    package.__file__ = spec.origin
    loader = spec.loader

    def __getattr__(name: str) -> Any:
        # `from package import X` for a name only the real __init__ defines: run it once, here.
        del vars(package)["__getattr__"]
        loader.exec_module(package)
        return getattr(package, name)

    vars(package)["__getattr__"] = __getattr__  # a module-level __getattr__ (PEP 562)
    sys.modules[PACKAGE] = package
    setattr(sys.modules["torch.distributed"], "_tools", package)  # noqa: B010 (what an import sets)


_package_without_init()

from torch.distributed._tools.common_utils import get_untyped_storages  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed._tools.mod_tracker import ModTracker  # noqa: E402

__all__ = ["MemTracker", "ModTracker", "get_untyped_storages"]
