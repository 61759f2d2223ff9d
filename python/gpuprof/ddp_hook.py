"""gpuprof's native DDP comm hook, built against the installed torch.

    python -m gpuprof.ddp_hook build     # once per torch version; needs g++ and ninja
    python -m gpuprof.ddp_hook status    # built or not, and where

Inside ``gpuprof.profile()`` a DistributedDataParallel model with no comm hook of its own gets
one that times its gradient buckets (``comm_buckets``). For a model whose parameters are in host
memory (gloo), that hook is this one when it is built: DDP's default reduction and the timing,
all in C++ (``_ddp_hook.cpp``), so no bucket takes the GIL. Otherwise it is gpuprof's Python
hook, which times the same but costs a CPU step a few percent (docs/benchmarks.md). A C++ hook
must match torch's C++ ABI, so it is compiled here, against the torch in use, into
``$GPUPROF_CACHE_DIR`` (default ``~/.cache/gpuprof``), one build per torch version and hook
source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["build", "built_path", "load"]

_NAME = "gpuprof_ddp_hook"
_SOURCE = Path(__file__).with_name("_ddp_hook.cpp")
_loaded: ModuleType | None = None


def _build_dir() -> Path:
    import torch
    root = Path(os.environ.get("GPUPROF_CACHE_DIR") or Path.home() / ".cache" / "gpuprof")
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return root / "ddp_hook" / tag.replace("+", "_")


def built_path() -> Path:
    """Where the hook for this torch and this hook source is (or would be) built."""
    return _build_dir() / f"{_NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compiles the hook against the installed torch (about 40 s on two cores) and returns
    the built module's path. Raises with the compiler's message when it fails."""
    from torch.utils import cpp_extension
    # torch runs `ninja` from PATH: a `pip install ninja` in this environment counts even when
    # the environment is not activated.
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("building needs ninja, which torch's C++ extension builder runs: "
                           "pip install ninja")
    directory = _build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=_NAME, sources=[str(_SOURCE)], build_directory=str(directory),
                       extra_cflags=["-O2"], verbose=verbose)
    path = built_path()
    if not path.exists():
        raise RuntimeError(f"the build left no {path.name} in {directory}")
    return path


def load() -> ModuleType | None:
    """The built hook module, imported once per process; None when it is not built for the
    torch in use (never builds)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = built_path()
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(_NAME, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded = module
    return module


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["build"] or args == ["build", "--verbose"]:
        try:
            path = build(verbose="--verbose" in args)
        except Exception as e:  # the compiler's output is in the message
            print(f"gpuprof.ddp_hook: build failed: {e}", file=sys.stderr)
            return 1
        print(f"gpuprof.ddp_hook: built {path}")
        return 0
    if args == ["status"]:
        path = built_path()
        print(f"gpuprof.ddp_hook: {'built' if path.exists() else 'not built'}: {path}")
        return 0 if path.exists() else 1
    print("usage: python -m gpuprof.ddp_hook build [--verbose] | status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
