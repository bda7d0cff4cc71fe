"""Caps PyTorch's CUDA allocator at the workspace's GPU share, in every Python process
of a gpupool workspace (kernels, terminals, scripts), and hooks IPython shells so that a
parked GPU comes back before the next cell runs (gpupool_resume.py).

Lazy on purpose: nothing happens until the user imports torch, and the cap is applied
when torch initialises CUDA, so importing torch stays as fast as ever and forked
DataLoader workers do not meet an early CUDA context.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    # we shadow any other sitecustomize (Debian ships one): run it too
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    for path in sys.path:
        if path and os.path.abspath(path) != here:
            candidate = os.path.join(path, "sitecustomize.py")
            if os.path.isfile(candidate):
                spec = importlib.util.spec_from_file_location("_gpupool_next_sitecustomize", candidate)
                if spec and spec.loader:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                return


def _install() -> None:
    fraction = os.environ.get("GPUPOOL_GPU_FRACTION")
    if not fraction or os.environ.get("GPUPOOL_TORCH_CAP", "1") == "0":
        return
    try:
        share = min(float(fraction), 1.0)
    except ValueError:
        return
    if share >= 1.0:
        return  # whole GPUs: nothing to cap

    import importlib.abc
    import importlib.machinery

    def cap(torch) -> None:
        def apply() -> None:
            for device in range(torch.cuda.device_count()):
                torch.cuda.set_per_process_memory_fraction(share, device)

        lazy_call = getattr(torch.cuda, "_lazy_call", None)  # runs when CUDA initialises
        if lazy_call is not None and not torch.cuda.is_initialized():
            lazy_call(apply)
        else:
            apply()

    class TorchWatcher(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                try:
                    cap(module)
                except Exception as err:  # never break `import torch`
                    print(f"gpupool: could not cap torch GPU memory: {err}", file=sys.stderr)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, TorchWatcher())


def _install_resume_hook() -> None:
    """Parked GPUs come back before the next cell (gpupool_resume.py): hook every IPython
    shell once it has its event manager; nothing is imported until IPython itself is."""
    if not os.environ.get("GPUPOOL_API_URL") or os.environ.get("GPUPOOL_RESUME_HOOK", "1") == "0":
        return
    import importlib.abc
    import importlib.machinery

    def patch(module) -> None:
        shell_class = module.InteractiveShell
        original = shell_class.init_events

        def init_events(self, *args, **kwargs):
            original(self, *args, **kwargs)
            try:
                import gpupool_resume

                gpupool_resume.install(self)
            except Exception as err:  # never break the kernel
                print(f"gpupool: could not install the GPU resume hook: {err}", file=sys.stderr)

        shell_class.init_events = init_events

    class ShellWatcher(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "IPython.core.interactiveshell":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                try:
                    patch(module)
                except Exception as err:  # an IPython without init_events: no hook, no harm
                    print(f"gpupool: no GPU resume hook: {err}", file=sys.stderr)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, ShellWatcher())


_install()
_install_resume_hook()
_chain_next_sitecustomize()
