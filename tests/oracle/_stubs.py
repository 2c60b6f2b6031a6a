"""Import stand-ins for the GPU-only and web-server packages SGLang imports at module level.

Only `import` statements get a stand-in; availability probes (importlib.util.find_spec, as transformers and
torch use) see nothing, so those libraries take their CPU paths. Runs inside the oracle venv only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

# GPU kernels (triton, sgl_kernel, flashinfer, tvm_ffi), the web/IPC stack (fastapi, uvicorn, uvloop, zmq,
# aiohttp), and a few heavy optional imports that sizing never calls.
STUBBED = frozenset((
    "triton", "sgl_kernel", "flashinfer", "tvm_ffi", "uvicorn", "fastapi", "uvloop", "zmq", "aiohttp",
    "setproctitle", "IPython", "sentencepiece", "torchvision", "partial_json_parser", "pynvml",
))  # fmt: skip


class _Anything(types.ModuleType):
    """A module whose every attribute is another stand-in; capitalised names are real classes."""

    __path__: tuple[str, ...] = ()  # a package, so submodule imports resolve

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():  # isinstance/issubclass checks and subclassing need a type
            cls = type(name, (), {"__init__": lambda self, *a, **k: None})
            setattr(self, name, cls)
            return cls
        full = f"{self.__name__}.{name}"
        module = sys.modules.setdefault(full, _Anything(full))
        return module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # used as a decorator (triton.jit, torch.library hooks): hand back the function
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in STUBBED:
            return None
        # frame 2 is importlib._bootstrap for an import statement, importlib/util.py for a probe
        if "_bootstrap" not in sys._getframe(2).f_code.co_filename:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Anything(spec.name)
        module.__version__ = "3.5.0"  # torch._inductor reads triton.__version__
        if spec.name == "triton.runtime":
            # fla/utils.py get_available_device: the triton backend names a torch device module ("cuda")
            target = types.SimpleNamespace(backend="cuda", arch=90, warp_size=32)
            active = types.SimpleNamespace(get_current_target=lambda: target)
            module.driver = types.SimpleNamespace(active=active)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    sys.meta_path.insert(0, _Finder())
