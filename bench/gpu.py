"""Peak GPU memory and power during a run (torch allocator + NVML); empty on CPU."""
from __future__ import annotations

import torch


class GpuMonitor:
    def __init__(self, device: torch.device):
        self.device, self.handle = device, None
        self.peak_power_w = 0.0
        self.peak_used_mb = 0.0
        if device.type != "cuda":
            return
        torch.cuda.reset_peak_memory_stats(device)
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # NVML missing or unsupported: report torch's numbers alone
            self.handle = None

    def sample(self) -> None:
        """Record power and memory now (called after each question)."""
        if self.handle is None:
            return
        import pynvml

        self.peak_power_w = max(self.peak_power_w, pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000)
        self.peak_used_mb = max(self.peak_used_mb, pynvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20)

    def report(self) -> dict:
        if self.device.type != "cuda":
            return {}
        return {"gpu_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "gpu_peak_power_w": self.peak_power_w or None, "gpu_peak_used_mb": self.peak_used_mb or None}
