"""Caps PyTorch's CUDA allocator at the workspace's GPU share, in every Python process
of a gpupool workspace (kernels, terminals, scripts), hooks IPython shells so that a
parked GPU comes back before the next cell runs (gpupool_resume.py), and points every
process, kernel and terminal at the share's CURRENT GPU, which the hub publishes when a
notebook moves or resumes on another GPU (gpupool_gpuenv.py).

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

    def cap(torch) -> None:
        def apply() -> None:
            for device in range(torch.cuda.device_count()):
                torch.cuda.set_per_process_memory_fraction(share, device)

        lazy_call = getattr(torch.cuda, "_lazy_call", None)  # runs when CUDA initialises
        if lazy_call is not None and not torch.cuda.is_initialized():
            lazy_call(apply)
        else:
            apply()

    _after_import("torch", cap, "could not cap torch GPU memory")


_WAITING: dict = {}  # module name -> [(then, failed)]: one watcher per module, every callback run


def _after_import(name: str, then, failed: str) -> None:
    """Call `then(module)` once `name` is imported (nothing is imported before); an error in
    `then` is reported and never breaks the import. Several callbacks for one module all run,
    in the order they were asked for."""
    import importlib.abc
    import importlib.machinery

    if name in _WAITING:
        _WAITING[name].append((then, failed))
        return
    _WAITING[name] = [(then, failed)]

    class Watcher(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                for call, why in _WAITING.pop(name, []):
                    try:
                        call(module)
                    except Exception as err:
                        print(f"gpupool: {why}: {err}", file=sys.stderr)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this one spec's loader only
            return spec

    sys.meta_path.insert(0, Watcher())


def _on_each_shell(install, could_not: str, failed: str) -> None:
    """`install(shell)` for every IPython shell once it has its event manager (its
    init_events); an error is printed, never raised into the kernel."""

    def patch(module) -> None:
        shell_class = module.InteractiveShell
        original = shell_class.init_events

        def init_events(self, *args, **kwargs):
            original(self, *args, **kwargs)
            try:
                install(self)
            except Exception as err:  # never break the kernel
                print(f"gpupool: {could_not}: {err}", file=sys.stderr)

        shell_class.init_events = init_events

    # an IPython without init_events: no hook, no harm
    _after_import("IPython.core.interactiveshell", patch, failed)


def _install_resume_hook() -> None:
    """Parked GPUs come back before the next cell (gpupool_resume.py): hook every IPython
    shell once it has its event manager; nothing is imported until IPython itself is."""
    if not os.environ.get("GPUPOOL_API_URL") or os.environ.get("GPUPOOL_RESUME_HOOK", "1") == "0":
        return

    def resume(shell) -> None:
        import gpupool_resume

        gpupool_resume.install(shell)

    _on_each_shell(resume, "could not install the GPU resume hook", "no GPU resume hook")


def _install_wake_hook() -> None:
    """A kernel whose notebook was hibernated (gpupool.gpu.hibernate) gets its variables back
    before its first cell: only kernels a Jupyter server started for a notebook, and only when
    gpupool is importable there; otherwise nothing happens."""
    if not os.environ.get("JPY_SESSION_NAME") or os.environ.get("GPUPOOL_HIBERNATE", "1") == "0":
        return

    def wake(shell) -> None:
        try:
            from gpupool.gpu.hibernate import install_wake
        except ImportError:  # a kernel environment without gpupool: nothing was hibernated by it
            return
        install_wake(shell)

    _on_each_shell(wake, "could not check for hibernated variables", "no wake from hibernation")


def _follow_current_gpu() -> None:
    """The share's current GPU for this process (before anything can initialise CUDA), and
    for every kernel and terminal the Jupyter server launches from now on."""
    if not os.environ.get("GPUPOOL_GPU_ENV_FILE"):
        return
    import gpupool_gpuenv

    gpupool_gpuenv.refresh()

    def kernels(module) -> None:
        cls = module.LocalProvisioner
        original = cls.launch_kernel

        async def launch_kernel(self, cmd, **kwargs):
            gpupool_gpuenv.refresh()  # the server's own, for what it starts otherwise
            if isinstance(kwargs.get("env"), dict):
                gpupool_gpuenv.refresh(kwargs["env"])
            return await original(self, cmd, **kwargs)

        cls.launch_kernel = launch_kernel

    def terminals(module) -> None:
        cls = module.TermManagerBase
        original = cls.make_term_env

        def make_term_env(self, *args, **kwargs):
            env = original(self, *args, **kwargs)
            gpupool_gpuenv.refresh(env)
            return env

        cls.make_term_env = make_term_env

    _after_import("jupyter_client.provisioning.local_provisioner", kernels, "kernels keep the server's GPU")
    _after_import("terminado.management", terminals, "terminals keep the server's GPU")


_follow_current_gpu()
_install()
_install_resume_hook()
_install_wake_hook()
_chain_next_sitecustomize()
