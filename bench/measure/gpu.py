"""GPU facts of a run (torch allocator + NVML): peak memory, peak power, and an energy meter for joules per generated
token; empty on CPU. NVML errors never stop a run: each failing call is named in meta.json (`nvml_errors`).

The NVML device is found by the CUDA device's UUID (right under CUDA_VISIBLE_DEVICES and for MIG instances, where
the CUDA ordinal is not NVML's index). Energy comes from NVML's total-energy counter (Volta and later), read before
and after each timed decode; without it, from a thread that integrates NVML's power reading every `poll_seconds`.
"""
from __future__ import annotations

import threading
import time

import torch


def cuda_uuid(device: torch.device) -> str:
    """The CUDA device's UUID as torch reports it (hex groups, without NVML's `GPU-` / `MIG-` prefix)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def nvml_handle(pynvml, uuid: str):
    """NVML's handle of the device with this UUID: a whole GPU (`GPU-<uuid>`) or a MIG instance (`MIG-<uuid>`)."""
    if uuid.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except pynvml.NVMLError:
        return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{uuid}")


def error_name(err: Exception) -> str:
    """`NVMLError_NotSupported: Not Supported`: the error's class and message."""
    return f"{type(err).__name__}: {err}"


class GpuMonitor:
    """Peak memory and power of a CUDA device over a run, and `energy_joules()` for per-turn energy."""

    def __init__(self, device: torch.device, poll_seconds: float = 0.05):
        self.device, self.handle, self.pynvml = device, None, None
        self.peak_power_w = 0.0
        self.peak_used_mb = 0.0
        self.errors: dict[str, str] = {}  # NVML call -> the error it raised
        self.energy_source: str | None = None  # "energy_counter", "power_polling" or None
        self._polled_joules, self._lock, self._stop = 0.0, threading.Lock(), threading.Event()
        if device.type != "cuda":
            return
        torch.cuda.reset_peak_memory_stats(device)
        try:
            import pynvml
        except ImportError:
            self.errors["import pynvml"] = "not installed (pip install nvidia-ml-py)"
            return
        self.pynvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            self.errors["nvmlInit"] = error_name(err)
            return
        try:
            self.handle = nvml_handle(pynvml, cuda_uuid(device))
        except pynvml.NVMLError as err:
            self.errors["nvmlDeviceGetHandleByUUID"] = error_name(err)
            return
        if self._read("nvmlDeviceGetTotalEnergyConsumption") is not None:
            self.energy_source = "energy_counter"
        elif self._read("nvmlDeviceGetPowerUsage") is not None:
            self.energy_source = "power_polling"
            threading.Thread(target=self._poll, args=(poll_seconds,), daemon=True, name="gpu-power").start()

    def _read(self, call: str, *args):
        """pynvml.<call>(handle, *args), or None with the error recorded under the call's name."""
        try:
            return getattr(self.pynvml, call)(self.handle, *args)
        except self.pynvml.NVMLError as err:
            self.errors.setdefault(call, error_name(err))
            return None

    def _poll(self, seconds: float) -> None:
        """Read the power every `seconds` until report(), adding up the energy (add_power)."""
        last = None
        while not self._stop.wait(seconds):
            milliwatts = self._read("nvmlDeviceGetPowerUsage")
            if milliwatts is not None:
                last = self.add_power(milliwatts / 1000, time.perf_counter(), last)

    def add_power(self, watts: float, now: float, last: tuple[float, float] | None) -> tuple[float, float]:
        """Add the joules since the `last` (seconds, watts) reading (a trapezoid) and keep the peak power; returns
        this reading."""
        with self._lock:
            if last is not None:
                self._polled_joules += (watts + last[1]) / 2 * (now - last[0])
            self.peak_power_w = max(self.peak_power_w, watts)
        return now, watts

    def energy_joules(self) -> float | None:
        """Joules the device has used so far (a running total: take differences), None where NVML cannot say."""
        if self.energy_source == "energy_counter":
            millijoules = self._read("nvmlDeviceGetTotalEnergyConsumption")
            return None if millijoules is None else millijoules / 1000
        if self.energy_source == "power_polling":
            with self._lock:
                return self._polled_joules
        return None

    def sample(self) -> None:
        """Record power and memory now (called after each group of questions a side answered)."""
        if self.handle is None:
            return
        milliwatts = self._read("nvmlDeviceGetPowerUsage")
        if milliwatts is not None:
            self.peak_power_w = max(self.peak_power_w, milliwatts / 1000)
        memory = self._read("nvmlDeviceGetMemoryInfo")
        if memory is not None:
            self.peak_used_mb = max(self.peak_used_mb, memory.used / 2**20)

    def report(self) -> dict:
        """meta.json's GPU keys (none on CPU); stops the power-polling thread."""
        self._stop.set()
        if self.device.type != "cuda":
            return {}
        return {"gpu_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "gpu_peak_power_w": self.peak_power_w or None, "gpu_peak_used_mb": self.peak_used_mb or None,
                "gpu_energy_source": self.energy_source, "nvml_errors": self.errors}
