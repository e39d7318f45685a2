"""verl on CPU: a ``cpu`` platform, verl's FSDP2 engines and workers on it, through verl's own hooks.

verl 0.9.1 ships platforms for CUDA, ROCm and Ascend only. Everything here plugs into its extension
points, never into its installed files:

- :class:`PlatformCPU` is registered with ``verl.plugin.platform.PlatformRegistry`` under ``cpu`` and
  selected by ``VERL_PLATFORM=cpu`` (set by the verl engine when ``engine.verl.device`` resolves to
  cpu; never auto-detected, so it changes nothing on a GPU machine). Its ``device_module``
  (:class:`CPUDeviceModule`) is ``torch.cpu`` plus the memory/stream calls verl makes on a device
  module (peak memory = the process's peak resident set size).
- :func:`register_cpu_engines` registers verl's ``FSDPEngineWithLMHead`` (subclassed so that the KL
  reference is not offloaded to pinned memory, see :func:`cpu_engine_classes`) / ``FSDPEngineWithValueHead``
  for ``device="cpu"``, backend ``fsdp2`` only, in verl's ``EngineRegistry`` (FSDP1 refuses CPU
  parameters with ``sync_module_states=True``).
- the workers that open a plain ``gloo`` process group are in :mod:`.workers`.

Every Ray worker imports this module through ``VERL_USE_EXTERNAL_MODULES`` (listed first, so the
platform exists before anything asks verl for one).
"""
from __future__ import annotations

import os
import resource
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def platform_is_cpu() -> bool:
    """True when verl's platform in this process is (or will be) ours: ``VERL_PLATFORM=cpu``."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


class CPUDeviceModule:
    """``torch.cpu`` as verl's device module (``get_torch_device()``), with the calls it lacks.

    Memory statistics are the process's: ``max_memory_allocated`` = peak resident set size,
    ``memory_allocated`` = current resident set size; ``mem_get_info`` = (available, total) RAM.
    Caches, streams' memory fractions and IPC are no-ops.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    # ---- identity
    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # verl's flops table has a "CPU" entry

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"  # verl moves tensors with .to(current_device())

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    # ---- random numbers (the CPU generator)
    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    # ---- memory
    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    max_memory_reserved = max_memory_allocated

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface on CPU (see the module docstring).

    Ray still places verl's workers on ``GPU`` bundles (its resource pools and their check count
    GPUs only), so :meth:`ray_resource_name` is ``GPU`` and the verl engine starts its local Ray
    cluster with ``num_gpus`` = CPU worker slots (``trainer.n_gpus_per_node``).
    """

    _module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen explicitly (VERL_PLATFORM=cpu), never by verl's auto-detection

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors with .to(get_device_id())

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for actors holding (logical) GPU resources

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# ------------------------------------------------------------------------------------------------
# engines
# ------------------------------------------------------------------------------------------------
CPU_BACKENDS = ("fsdp2",)


def cpu_engine_classes():
    """``(language_model, value_model)`` engine classes for cpu: verl's FSDP engines, the first one with one change.

    verl's FSDP2 engine puts a forward-only model (the KL reference) under ``CPUOffloadPolicy(pin_memory=True)``
    whatever the offload settings, and pinning memory needs an accelerator. On CPU there is nothing to offload
    to, so the reference is built like the actor (the ``fsdp_config.param_offload`` / ``offload_policy``
    settings still apply); everything else is verl's.
    """
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    class CPUFSDPEngineWithLMHead(FSDPEngineWithLMHead):
        def _build_fsdp_module(self, module):
            forward_only = self.engine_config.forward_only
            self.engine_config.forward_only = False  # only the offload choice reads it here
            try:
                return super()._build_fsdp_module(module)
            finally:
                self.engine_config.forward_only = forward_only

    return CPUFSDPEngineWithLMHead, FSDPEngineWithValueHead


def register_cpu_engines() -> None:
    """The FSDP2 engines under ``device="cpu"`` in verl's ``EngineRegistry`` (idempotent).

    Importing verl's FSDP module reads the platform, so call this only when it is ours.
    """
    from verl.workers.engine.base import EngineRegistry

    for model_type, cls in zip(("language_model", "value_model"), cpu_engine_classes()):
        have = EngineRegistry._engines.get(model_type, {})
        todo = [b for b in CPU_BACKENDS if PLATFORM_NAME not in have.get(b, {})]
        if todo:
            EngineRegistry.register(model_type=model_type, backend=todo, device=PLATFORM_NAME)(cls)


if platform_is_cpu():
    register_cpu_engines()
