"""The phase timer (bench/engine/loop.py PhaseTimer) on its two paths: a clock read at each lap, and CUDA-style events
recorded at each lap and read after the turn (here a fake event class over a fake clock: no GPU needed); the
profile's chain and tree points (bench/planning/costmodel.py)."""
from __future__ import annotations

import json

import pytest
import torch

from bench.artifacts import PROJECT_ROOT
from bench.engine.batched import BatchedEngine
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.timing import PhaseTimer
from bench.planning.costmodel import Profile, profile_path
from bench.planning.profile import measure_forward_times, tree_step_inputs
from bench.records import PHASES
from methods.pld import PromptLookupDrafter
from tests.test_costmodel import BASE, PER_TOKEN, TREE_MASK, FakeClock, clock, slow_model, slowed  # noqa: F401 (fixtures)


class FakeEvents:
    """Makes events with torch.cuda.Event's timing API over a fake clock: an event's time is the clock's when it is
    recorded; elapsed_time (ms) refuses events the host has not waited for, as CUDA does."""

    def __init__(self, clock: FakeClock):
        self.clock, self.syncs, self.made = clock, 0, []

    def __call__(self):
        events = self

        class Event:
            def __init__(self):
                self.time, self.done = None, False

            def record(self):
                self.time = events.clock()

            def synchronize(self):
                events.syncs += 1
                for event in events.made:  # the device is done with everything recorded so far
                    event.done = event.time is not None

            def elapsed_time(self, end) -> float:
                assert self.done and end.done, "read before the device got there"
                return (end.time - self.time) * 1e3

        event = Event()
        self.made.append(event)
        return event


def test_timer_with_events_waits_once_after_the_turn():
    clock = FakeClock()
    events = FakeEvents(clock)
    timer = PhaseTimer(torch.device("cpu"), event=events)
    for phase, seconds in [("prefill", 0.5), ("draft", 0.25), ("verify", 1.0), ("accept", 0.125), ("draft", 0.25)]:
        clock.advance(seconds)
        timer.lap(phase)
    assert events.syncs == 0 and len(events.made) == 6
    assert timer.seconds == {"prefill": 0.5, "draft": 0.5, "verify": 1.0, "accept": 0.125}
    assert events.syncs == 1


def test_timer_with_a_clock_reads_it_at_each_lap():
    clock = FakeClock()
    timer = PhaseTimer(torch.device("cpu"), clock=clock)
    clock.advance(2.0)
    timer.lap("prefill")
    mark = timer.mark()
    clock.advance(3.0)
    timer.lap("verify")
    assert timer.seconds == {"prefill": 2.0, "draft": 0.0, "verify": 3.0, "accept": 0.0}
    assert timer.since_start(mark) == 2.0


def test_cuda_timer_uses_timing_events(monkeypatch):
    """On a CUDA device, without a clock, the timer records torch.cuda.Event(enable_timing=True) and never
    synchronises the device itself."""
    made = []

    class Recorded:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def record(self):
            pass

    monkeypatch.setattr(torch.cuda, "Event", Recorded)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronised during the turn"))
    timer = PhaseTimer(torch.device("cuda"))
    timer.lap("prefill")
    assert made == [{"enable_timing": True}] * 2


def watch_syncs(model, events: FakeEvents) -> None:
    """model.syncs_seen: how many times the host had waited for events when each forward began."""
    forward, model.syncs_seen = model.forward, []

    def watched(*args, **kwargs):
        model.syncs_seen.append(events.syncs)
        return forward(*args, **kwargs)

    model.forward = watched


def test_engine_events_are_read_only_after_the_turn(slow_model, clock, prompts, one_thread):
    """Through a whole turn the engine records events and never waits for them; afterwards the phases are what the
    forwards cost on the fake clock."""
    events = FakeEvents(clock)
    watch_syncs(slow_model, events)
    engine = SpeculativeEngine(slow_model, PromptLookupDrafter(slow_model, max_ngram_size=1), event=events)
    out = engine.generate(prompts[2], StopCondition(16))
    assert set(slow_model.syncs_seen) == {0} and events.syncs == 1  # phase_seconds was read once, at the end
    verify = sum(BASE + PER_TOKEN * n + TREE_MASK * t for n, t in zip(out.verified_tokens, out.tree_steps))
    assert out.phase_seconds == pytest.approx({"prefill": BASE + PER_TOKEN * len(prompts[2]), "draft": 0.0,
                                               "verify": verify, "accept": 0.0}, abs=1e-12)


def test_batched_phases_and_finish_times_come_from_events(slow_model, clock, prompts, one_thread):
    """The batched engine's phases and each row's finish time come from events read after the batch: a row that
    stops earlier finishes earlier, the last one when the batch's clock stops."""
    events = FakeEvents(clock)
    watch_syncs(slow_model, events)
    engine = BatchedEngine(slow_model, PromptLookupDrafter(slow_model, max_ngram_size=1), event=events)
    out = engine.generate(prompts, StopCondition(12, frozenset()), [0, 1, 2])
    assert set(slow_model.syncs_seen) == {0} and events.syncs >= 1 and set(out.phase_seconds) == set(PHASES)
    total = sum(out.phase_seconds.values())
    assert total == pytest.approx(clock.now) and max(out.finish_seconds) == pytest.approx(total)
    prefills = [BASE + PER_TOKEN * len(p) for p in prompts]
    assert out.phase_seconds["prefill"] == pytest.approx(sum(prefills))
    assert all(f >= sum(prefills) for f in out.finish_seconds)


def test_tree_points_take_a_tree_mask_of_the_step_shape(tiny_model, windowed_model):
    inputs = tree_step_inputs(tiny_model, 7, 10, batch=3)
    assert inputs["attention_mask"].shape == (3, 1, 7, 17) and inputs["position_ids"].tolist()[0] == \
        [10, 11, 11, 12, 12, 12, 12]
    visible = inputs["attention_mask"][0, 0] == 0
    assert visible[:, :10].all() and visible[3, 10:].tolist() == [True, True, False, True, False, False, False]
    seconds = measure_forward_times(windowed_model, [1, 4], [8], repeats=1, batch=2)  # per-layer-type masks
    assert set(seconds) == {"chain", "tree"} and all(s > 0 for table in seconds.values() for s in table[0])


def test_committed_profiles_sit_at_their_own_path_and_old_ones_serve_both_kinds():
    folder = PROJECT_ROOT / "results" / "profiles"
    paths = sorted(folder.glob("*.json"))
    assert paths
    for path in paths:
        data = json.loads(path.read_text())
        assert profile_path(folder, data["setting"]) == path  # where a run on that machine looks for it
        profile = Profile.load(path, data["setting"], "make it")
        if data.get("tree_seconds") is None:
            assert profile.forward_seconds(5, 300, tree=True) == profile.forward_seconds(5, 300)
    profile = Profile({}, [1, 4], [16], [[1.0, 4.0]], tree_seconds=[[1.5, 4.5]])
    assert profile.forward_seconds(2, 16) == 2.0 and profile.forward_seconds(2, 16, tree=True) == 2.5
