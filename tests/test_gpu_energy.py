"""The GPU path without a GPU: NVML is a fake module (monkeypatched `pynvml`), torch.cuda's queries are stubbed.
The NVML device is found by UUID, NVML errors are named and not raised, energy per token comes from counter deltas
(per turn, shared out by tokens in a batch) into records, summary and report; the model loads with device_map."""
from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from bench.engine.batched import BatchOutput
from bench.engine.loop import StopCondition, TurnOutput
from bench.measure.decoding import BatchQuestionDecoder, QuestionDecoder
from bench.measure.gpu import GpuMonitor
from bench.measure.metrics import joules_per_token, summarize
from bench.measure.run import run
from bench.records import PHASES, answer_record, read_jsonl
from bench.report.render import write_report
from tests.report_fixtures import record, write_run

UUID = "5e2f0d1c-0000-4a4a-9b9b-123456789abc"  # as torch prints a device's uuid


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # pynvml's naming
    def __str__(self):
        return "Not Supported"


class NVMLError_NotFound(NVMLError):
    def __str__(self):
        return "Not Found"


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self):
        return "NVML Shared Library Not Found"


def fake_nvml(known=(f"GPU-{UUID}",), energy_mj=None, power_mw=250_000, memory_fails=False):
    """A pynvml stand-in: devices `known` by UUID; `energy_mj` the total-energy counter's successive readings (None:
    not supported); `looked_up` lists the UUIDs asked for."""
    readings = iter(energy_mj or ())
    nvml = SimpleNamespace(NVMLError=NVMLError, looked_up=[], nvmlInit=lambda: None)

    def by_uuid(uuid):
        nvml.looked_up.append(uuid)
        if uuid not in known:
            raise NVMLError_NotFound()
        return f"handle:{uuid}"

    def by_index(index):
        raise AssertionError("the NVML device must be found by UUID, not by CUDA ordinal")

    def energy(handle):
        if energy_mj is None:
            raise NVMLError_NotSupported()
        return next(readings)

    def memory(handle):
        if memory_fails:
            raise NVMLError_NotSupported()
        return SimpleNamespace(used=512 * 2**20)

    nvml.nvmlDeviceGetHandleByUUID, nvml.nvmlDeviceGetHandleByIndex = by_uuid, by_index
    nvml.nvmlDeviceGetTotalEnergyConsumption, nvml.nvmlDeviceGetMemoryInfo = energy, memory
    nvml.nvmlDeviceGetPowerUsage = lambda handle: power_mw
    return nvml


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's queries answered as by one GPU with UUID; returns the devices asked about."""
    asked = []

    def properties(device):
        asked.append(device)
        return SimpleNamespace(uuid=UUID)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**20)
    return asked


def monitor(monkeypatch, nvml, device="cuda:1") -> GpuMonitor:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return GpuMonitor(torch.device(device), poll_seconds=3600)  # the polling thread never samples in a test


def test_the_nvml_device_is_found_by_the_cuda_devices_uuid(monkeypatch, fake_cuda):
    nvml = fake_nvml(energy_mj=[7_000])
    gpu = monitor(monkeypatch, nvml)
    assert fake_cuda == [torch.device("cuda:1")] and nvml.looked_up == [f"GPU-{UUID}"]
    assert gpu.handle == f"handle:GPU-{UUID}" and gpu.energy_source == "energy_counter"
    gpu.sample()
    assert gpu.report() == {"gpu_peak_allocated_mb": 3.0, "gpu_peak_power_w": 250.0, "gpu_peak_used_mb": 512.0,
                            "gpu_energy_source": "energy_counter", "nvml_errors": {}}


def test_a_mig_instance_is_found_by_its_mig_uuid(monkeypatch, fake_cuda):
    nvml = fake_nvml(known=(f"MIG-{UUID}",), energy_mj=[7_000])
    gpu = monitor(monkeypatch, nvml)
    assert nvml.looked_up == [f"GPU-{UUID}", f"MIG-{UUID}"] and gpu.handle == f"handle:MIG-{UUID}"


def test_nvml_errors_are_named_in_the_report_not_raised(monkeypatch, fake_cuda):
    lost = monitor(monkeypatch, fake_nvml(known=()))
    lost.sample()
    assert lost.energy_joules() is None and lost.energy_source is None
    assert lost.report()["nvml_errors"] == {"nvmlDeviceGetHandleByUUID": "NVMLError_NotFound: Not Found"}

    def no_library():
        raise NVMLError_LibraryNotFound()

    no_driver = fake_nvml()
    no_driver.nvmlInit = no_library
    assert monitor(monkeypatch, no_driver).report()["nvml_errors"] == {
        "nvmlInit": "NVMLError_LibraryNotFound: NVML Shared Library Not Found"}

    partial = monitor(monkeypatch, fake_nvml(energy_mj=None, memory_fails=True))  # no energy counter, say pre-Volta
    partial.sample()
    report = partial.report()
    assert report["gpu_energy_source"] == "power_polling" and report["gpu_peak_power_w"] == 250.0
    assert report["nvml_errors"] == {"nvmlDeviceGetTotalEnergyConsumption": "NVMLError_NotSupported: Not Supported",
                                     "nvmlDeviceGetMemoryInfo": "NVMLError_NotSupported: Not Supported"}


def test_without_pynvml_the_run_goes_on_and_says_why(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    report = GpuMonitor(torch.device("cuda")).report()
    assert report["gpu_energy_source"] is None and report["gpu_peak_power_w"] is None
    assert report["nvml_errors"] == {"import pynvml": "not installed (pip install nvidia-ml-py)"}


def test_power_polling_adds_up_trapezoids(monkeypatch, fake_cuda):
    gpu = monitor(monkeypatch, fake_nvml(energy_mj=None))
    last = gpu.add_power(100.0, 10.0, None)
    assert gpu.energy_joules() == 0.0
    last = gpu.add_power(300.0, 10.5, last)
    gpu.add_power(300.0, 12.5, last)
    assert gpu.energy_joules() == pytest.approx((100 + 300) / 2 * 0.5 + 300 * 2.0) and gpu.peak_power_w == 300.0


def test_cpu_has_no_gpu_facts():
    gpu = GpuMonitor(torch.device("cpu"))
    assert gpu.report() == {} and gpu.energy_joules() is None and gpu.energy_source is None


class ScriptedEngine:
    """Returns the given turns in order, as an engine would."""

    drafter = None

    def __init__(self, outputs):
        self.outputs = iter(outputs)

    def generate(self, prompt, stop, seed=None):
        return next(self.outputs)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def test_energy_per_token_comes_from_counter_deltas_around_each_turn(monkeypatch, fake_cuda, tokenizer):
    # counter in mJ: the probe at start, then before/after turn 1 (12 J) and before/after turn 2 (6 J)
    gpu = monitor(monkeypatch, fake_nvml(energy_mj=[1_000_000, 1_000_000, 1_012_000, 1_020_000, 1_026_000]))
    phases = {phase: 0.0 for phase in PHASES}
    engine = ScriptedEngine([TurnOutput([5, 6, 7, 8], [1, 1, 1], phase_seconds=phases),
                             TurnOutput([9, 10], [1], phase_seconds=phases)])
    decoder = QuestionDecoder(engine, tokenizer, StopCondition(8), torch.device("cpu"), energy=gpu.energy_joules)
    turns = decoder({"question_id": 3, "turns": ["hi", "more"]}, seed=0)
    assert [t["energy_j"] for t in turns] == [12.0, 6.0]
    method = answer_record({"question_id": 3, "category": "qa"}, "m", "pld", "key", turns)
    assert method["choices"][0]["energy_j"] == [12.0, 6.0] and joules_per_token([method]) == pytest.approx(18 / 6)
    vanilla = record(3, "qa", "vanilla", [[1] * 3, [1]], [1.0, 1.0])  # 4 and 2 tokens
    vanilla["choices"][0]["energy_j"] = [30.0, 15.0]
    row = summarize("pld", [method], {3: vanilla}).iloc[-1]
    assert row.joules_per_token == pytest.approx(3.0) and row.baseline_joules_per_token == pytest.approx(7.5)


def test_a_batchs_energy_is_shared_out_by_tokens(monkeypatch, fake_cuda, tokenizer):
    gpu = monitor(monkeypatch, fake_nvml(energy_mj=[0, 0, 8_000]))
    batch = BatchOutput([TurnOutput([5, 6, 7], [1, 1]), TurnOutput([8], [])], [0.1, 0.05], {})
    decoder = BatchQuestionDecoder(ScriptedEngine([batch]), tokenizer, StopCondition(8), torch.device("cpu"),
                                   energy=gpu.energy_joules)
    results = decoder([{"question_id": 1, "turns": ["a"]}, {"question_id": 2, "turns": ["b"]}], [0, 0])
    assert [turns[0]["energy_j"] for turns in results] == [6.0, 2.0]


def test_a_failed_reading_leaves_the_turn_without_energy_not_invented(tokenizer):
    readings = iter([5.0, None])
    decoder = QuestionDecoder(ScriptedEngine([TurnOutput([5], [1])]), tokenizer, StopCondition(8), torch.device("cpu"),
                              energy=lambda: next(readings))
    [turn] = decoder({"question_id": 1, "turns": ["a"]}, seed=0)
    assert turn["energy_j"] is None
    assert math.isnan(joules_per_token([answer_record({"question_id": 1, "category": "qa"}, "m", "v", "k", [turn])]))


def test_a_cpu_run_has_no_energy_columns_filled(compose, tmp_path):
    summary = run(compose("method=vanilla", "task=qa", "task.limit=1"))
    assert summary.joules_per_token.isna().all() and summary.baseline_joules_per_token.isna().all()
    assert "energy_j" not in read_jsonl(tmp_path / "run" / "answers.jsonl")[0]["choices"][0]
    assert "nvml_errors" not in json.loads((tmp_path / "run" / "meta.json").read_text())


def test_the_report_shows_joules_per_token_only_where_measured(tmp_path):
    answers, baselines = [record(321, "qa", "pld", [[3]], [0.5])], [record(321, "qa", "vanilla", [[1] * 3], [1.0])]
    answers[0]["choices"][0]["energy_j"], baselines[0]["choices"][0]["energy_j"] = [2.0], [4.0]
    write_run(tmp_path / "runs" / "gpu", "pld", answers, baselines, device="cuda:0", device_name="Test GPU")
    write_run(tmp_path / "runs" / "cpu", "pld", [record(321, "qa", "pld", [[3]], [0.5])],
              [record(321, "qa", "vanilla", [[1] * 3], [1.0])])
    board = write_report(tmp_path / "runs", tmp_path / "report").set_index(["device", "task"])
    assert board.loc[("cuda:0", "overall"), "joules_per_token"] == pytest.approx(0.5)
    assert board.loc[("cuda:0", "overall"), "baseline_joules_per_token"] == pytest.approx(1.0)
    assert math.isnan(board.loc[("cpu", "overall"), "joules_per_token"])
    sections = (tmp_path / "report" / "leaderboard.md").read_text().split("\n## ")
    gpu = next(s for s in sections if s.startswith("m · cuda:0"))
    cpu = next(s for s in sections if s.startswith("m · cpu"))
    header = next(line for line in gpu.splitlines() if line.startswith("| Method"))
    assert header.endswith("| Overall (1 task) | vanilla tok/s | tok/s | Lossless | J/token |") and "| 0.500 |" in gpu
    assert "J/token" not in next(line for line in cpu.splitlines() if line.startswith("| Method"))


def test_the_model_is_loaded_onto_its_device_directly(monkeypatch, tiny_checkpoint):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from bench.models import load_model

    calls, real = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    cfg = OmegaConf.create({"path": str(tiny_checkpoint), "dtype": "float64", "attn_implementation": "sdpa",
                            "install_hint": "-"})
    model, _ = load_model(cfg, torch.device("cpu"))
    assert calls[0]["device_map"] == torch.device("cpu") and model.device == torch.device("cpu")
