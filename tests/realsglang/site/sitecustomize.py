"""Import stand-ins that let the PyPI release of SGLang 0.5.23 serve on the CPU (the real-SGLang venv).

On PYTHONPATH, so the server and the scheduler and detokenizer processes it spawns all get it. Only
`import` statements get a stand-in; availability probes (importlib.util.find_spec, as torch and transformers
use) still see nothing, so those libraries take their CPU paths. Each stand-in, and the SGLang line that
needs it (sglang 0.5.23 wheel):

- triton: `import triton` unconditionally at sglang/srt/utils/common.py:91 (and `@triton.jit` kernels
  defined at import across sglang/kernels/). `triton.runtime.driver.active` raises, as real triton does
  without a GPU driver: sglang/kernels/ops/attention/fla/utils.py:241-245 then answers "cpu", where a
  stand-in object would crash `getattr(torch, device)` at line 265.
- sgl_kernel: `from sgl_kernel import copy_all_layer_kv_cache_cpu` at
  sglang/kernels/ops/kvcache/cache_move.py:10 when is_cpu(). `torch.ops.sgl_kernel` stays torch's real,
  empty namespace, so cpu_has_amx_support() (srt/utils/common.py:354-372) is False and every layer takes
  its pure-torch path.
  `import triton.knobs` is refused (ImportError, as from a triton without it): the scheduler's
  triton_load_watch.install() (srt/managers/scheduler.py:1982, srt/utils/triton_load_watch.py:46-49)
  then returns instead of hooking a stand-in after the engine is up.
- IPython: `from IPython.display import HTML, display` at sglang/utils.py:25.
- torchvision: `import torchvision.transforms as T` at sglang/srt/multimodal/internvl_utils.py:5.

DEPLOYCTL_STANDIN_TRACE=PATH appends one line per use of a stand-in (import, attribute read, call, class
made): `<unix time> <pid> <kind> <name> <file>:<line> <function>` of the code that used it, so a test can
show that after the weights load nothing but module bodies (`@triton.jit` definitions of a module imported
late) touches one: no SGLang code path runs on a stand-in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
import types
from typing import Any

STUBBED = frozenset(("triton", "sgl_kernel", "IPython", "torchvision"))
REFUSED = frozenset(("triton.knobs",))
_TRACE_PATH = os.environ.get("DEPLOYCTL_STANDIN_TRACE", "")
_trace_file: Any = None
_classes: dict[str, type] = {}
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def _trace(kind: str, name: str) -> None:
    global _trace_file
    if not _TRACE_PATH:
        return
    if _trace_file is None:
        _trace_file = open(_TRACE_PATH, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename in (__file__, *_IMPORT_MACHINERY):
        frame = frame.f_back
    code = frame.f_code
    where = f"{code.co_filename}:{frame.f_lineno} {code.co_name}"
    _trace_file.write(f"{time.time():.6f} {os.getpid()} {kind} {name} {where}\n")


class NoDriverError(RuntimeError):
    pass


def _stand_in_class(full: str) -> type:
    """A real class (isinstance, subclassing and annotations need one); making one is traced."""
    if full not in _classes:

        def __init__(self: object, *args: Any, **kwargs: Any) -> None:
            _trace("new", full)

        _classes[full] = type(full.rsplit(".", 1)[1], (), {"__init__": __init__, "__module__": full})
    return _classes[full]


class _Anything(types.ModuleType):
    """A module whose every attribute is another stand-in; capitalised names are classes."""

    __path__: tuple[str, ...] = ()  # a package, so submodule imports resolve

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in REFUSED:
            raise AttributeError(name)
        _trace("get", full)
        if full == "triton.runtime.driver.active":
            raise NoDriverError("0 active drivers ([]). There should only be one.")
        if name[:1].isupper():
            return _stand_in_class(full)
        # not cached on self: every later use passes through here too, so the trace sees it
        return sys.modules.setdefault(full, _Anything(full))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _trace("call", self.__name__)
        # a decorator (triton.jit, triton.autotune(...)): hand back the function
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in STUBBED or name in REFUSED:
            return None
        # frame 2 is importlib._bootstrap for an import statement, importlib/util.py for a probe
        if "_bootstrap" not in sys._getframe(2).f_code.co_filename:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _trace("import", spec.name)
        module = _Anything(spec.name)
        if spec.name == "triton":
            module.__version__ = "3.5.0"  # torch._inductor reads triton.__version__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Finder())


def _page_size_by_hand(argv: list[str]) -> None:
    """DEPLOYCTL_STANDIN_PAGE_SIZE=N: the server's own `--page-size` word becomes N, as a hand edit of the
    unit would make it. deployctl refuses to render roles on different page sizes (agent/pd/refusals.py),
    so a test of what SGLang does on one (tests/integration/test_real_pd_apply.py) sets it here, in a unit
    deployctl rendered with this variable in its environment. The processes SGLang spawns get their
    arguments from the parent, not from their argv."""
    size = os.environ.get("DEPLOYCTL_STANDIN_PAGE_SIZE", "")
    if size and "--page-size" in argv[:-1]:
        argv[argv.index("--page-size") + 1] = size


_page_size_by_hand(getattr(sys, "argv", []))  # an embedded interpreter may have none
