"""Upper bounds on a run's speedup from its recorded steps: what better sizing of the same drafts would have given.

Every figure is a predicted speedup over vanilla on a forward-time profile, aggregated as `predicted_speedup`
(bench/planning/costmodel.py): both sides keep the measured prefill. They are bounds under the model below, so
approximations, not measurements (docs/cost-model.md, "Bounds from recorded steps").

- A turn's positions p = 0 .. n count the tokens decoded after the prefill's (n = new_tokens - 1: the end). Recorded
  step s starts at p_s (the earlier accept lengths summed), at context c_s = prompt + p_s (`turn_contexts`), added
  A_s tokens (its accept length), drafted d_s nodes (`drafted_tokens`; where absent, verified_tokens - 1) and carried
  aux_s = verified - 1 - d_s auxiliary inputs (Lookahead's window).
- A one-token step is possible at every p: 1 token for t(1, prompt + p), what vanilla pays.
- At p_s, step s with j = 0 .. d_s of its drafts kept: A_s tokens for j = d_s (the step as recorded), else
  min(A_s, j + 1); for t(1 + j + aux_s, c_s) (its tree point where it took a tree mask and kept more than its root)
  plus j / d_s of its drafting seconds (the turn's draft phase spread evenly over its steps that drafted; over all
  its steps, whatever j, where none did). Trees are taken as their accepted path: a cap at j keeps min(A_s - 1, j)
  accepted nodes, as if the path's nodes came first (exact for chains, optimistic for trees); drafting time is taken
  as linear in the nodes kept.
- Between two recorded starts (a capped step stopped short) only one-token steps are possible.

`replayed`: the run's steps (`predicted_speedup`). `best_fixed_k`: every step capped at k drafts, for the k in
0 .. K (the most any step drafted) whose aggregate speedup is best; k = K replays the run. `oracle`: each step's j
chosen knowing its outcome. `oracle_combine`: two runs of the same questions (greedy decoding is lossless, so both
made the same tokens), at each position either run's step. Every path through a turn yields its n tokens, so the best
tokens/s is the fewest seconds (a shortest-path DP, no ratio programming), and the per-record minima also maximise the
mean of tokens/s. Each option set holds the one before: combine >= oracle >= best_fixed_k >= replayed (to rounding).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from bench.planning.costmodel import Profile, predicted_speedup, speedup_of


@dataclass
class SpeedupBounds:
    """Predicted speedups of one run: with every step capped at k = 0 .. K drafts (`by_k`), the oracle's, and its own
    steps' (`replayed`)."""

    by_k: list[float]
    oracle: float
    replayed: float = math.nan

    @property
    def best_fixed_k(self) -> int:
        return int(np.argmax(self.by_k))

    @property
    def best_fixed_k_speedup(self) -> float:
        return self.by_k[self.best_fixed_k]


@dataclass
class _Turn:
    """One turn's options: prefill seconds, a one-token step's seconds at each position, and per recorded step s its
    start, drafted count and its options j = 0 .. d_s, flat (step s's at offsets[s] ..): end position, seconds."""

    prefill: float
    plain: np.ndarray
    starts: np.ndarray
    drafted: np.ndarray
    offsets: np.ndarray
    ends: np.ndarray
    seconds: np.ndarray

    def options(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(start, ends, seconds) of each recorded step's options."""
        cuts = [*self.offsets, len(self.ends)]
        return [(int(p), self.ends[a:b], self.seconds[a:b]) for p, a, b in zip(self.starts, cuts, cuts[1:])]

    def capped_seconds(self, top: int) -> np.ndarray:
        """[top + 1] seconds with every recorded step capped at k = 0 .. top drafts, one-token steps elsewhere."""
        spent = np.concatenate([[0.0], np.cumsum(self.plain)])  # one-token steps' seconds up to each position
        chosen = self.offsets + np.minimum(np.arange(top + 1)[:, None], self.drafted)  # [top + 1, steps]
        saved = spent[self.ends[chosen]] - spent[self.starts] - self.seconds[chosen]
        return self.prefill + spent[-1] - saved.sum(axis=1)

    def least_seconds(self, options: list[tuple[int, np.ndarray, np.ndarray]]) -> float:
        """Prefill + the fewest seconds from position 0 to the end, by one-token steps or `options` at their start."""
        at = defaultdict(list)
        for start, ends, seconds in options:
            at[start].append((ends, seconds))
        best = np.zeros(len(self.plain) + 1)  # seconds from each position to the end
        for p in range(len(self.plain) - 1, -1, -1):
            best[p] = min([self.plain[p] + best[p + 1], *(float(np.min(s + best[e])) for e, s in at[p])])
        return self.prefill + float(best[0])


def _forward_seconds(profile: Profile, lengths: np.ndarray, contexts: np.ndarray, tree: bool) -> np.ndarray:
    """`Profile.forward_seconds` at many (L, c) at once: bilinear, as weights of the grid's hat functions (the same
    figures, to rounding)."""
    table = profile.tree_seconds if tree and profile.tree_seconds is not None else profile.seconds

    def hats(x, grid):
        return np.array([np.interp(x, grid, unit) for unit in np.eye(len(grid))])

    return np.einsum("ci,cl,li->i", hats(contexts, profile.contexts), np.asarray(table, dtype=float),
                     hats(lengths, profile.lengths))


def _turns(record: dict, profile: Profile) -> list[_Turn] | None:
    """A record's turns as options (module docstring), or None without step data (as `predicted_seconds`)."""
    choice = record["choices"][0]
    if "verified_tokens" not in choice or "prompt_tokens" not in choice:
        return None
    turns, first = [], 0
    for t, count in enumerate(choice["decoding_steps"]):
        accepts = np.array(choice["accept_lengths"][first : first + count], dtype=int)
        first += count
        verified = np.array(choice["verified_tokens"][t], dtype=int)
        drafted = np.array(choice["drafted_tokens"][t], dtype=int) if "drafted_tokens" in choice else verified - 1
        trees = np.array(choice["tree_steps"][t] if "tree_steps" in choice else [False] * count, dtype=bool)
        prompt, phases, n = choice["prompt_tokens"][t], choice["phase_times"][t], choice["new_tokens"][t] - 1
        starts = np.cumsum(accepts) - accepts
        drafting = drafted > 0 if drafted.any() else np.ones(count, dtype=bool)
        per_step = np.where(drafting, phases["draft"] / max(drafting.sum(), 1), 0.0)
        offsets = np.cumsum(drafted + 1) - (drafted + 1)
        step = np.repeat(np.arange(count), drafted + 1)  # each option's step
        kept = np.arange(len(step)) - offsets[step]
        d, a = drafted[step], accepts[step]
        length, context = verified[step] - d + kept, prompt + starts[step]
        forward = np.where(trees[step] & (length > 1), _forward_seconds(profile, length, context, True),
                           _forward_seconds(profile, length, context, False))
        drafting_seconds = per_step[step] * np.where(d > 0, kept / np.maximum(d, 1), 1.0)
        ends = starts[step] + np.where(kept == d, a, np.minimum(a, kept + 1))
        plain = _forward_seconds(profile, np.ones(n), prompt + np.arange(n), False)
        turns.append(_Turn(phases["prefill"], plain, starts, drafted, offsets, ends, forward + drafting_seconds))
    return turns


def _tokens(records: list[dict]) -> list[int]:
    return [sum(r["choices"][0]["new_tokens"]) for r in records]


def _vanilla(turns: list[_Turn]) -> float:
    return sum(t.prefill + float(t.plain.sum()) for t in turns)


def speedup_bounds(records: list[dict], profile: Profile, replayed: bool = True) -> SpeedupBounds | None:
    """Fixed-k, oracle and (unless `replayed` is False: a caller that has it) replayed speedups of one run's records;
    None when there are none or one lacks step data."""
    runs = [_turns(r, profile) for r in records]
    if not records or any(turns is None for turns in runs):
        return None
    top = max((int(d) for turns in runs for t in turns for d in t.drafted), default=0)
    tokens, vanilla = _tokens(records), [_vanilla(turns) for turns in runs]
    capped = np.array([sum((t.capped_seconds(top) for t in turns), np.zeros(top + 1)) for turns in runs])
    oracle = [sum(t.least_seconds(t.options()) for t in turns) for turns in runs]
    return SpeedupBounds([speedup_of(tokens, capped[:, k], vanilla) for k in range(top + 1)],
                         speedup_of(tokens, oracle, vanilla),
                         predicted_speedup(records, profile) if replayed else math.nan)


def oracle_combine(records_a: list[dict], records_b: list[dict], profile: Profile) -> float:
    """The oracle over both runs' steps (at each position either's), paired by question_id; run a is the reference
    (its prefills on both sides, its questions), so the figure is >= run a's oracle. NaN without step data;
    ValueError when b lacks one of a's questions or a turn's prompt or tokens differ (not the same answers)."""
    by_id = {r["question_id"]: r for r in records_b}
    missing = [r["question_id"] for r in records_a if r["question_id"] not in by_id]
    if missing:
        raise ValueError(f"oracle_combine: run b lacks questions {missing}")
    seconds, vanilla = [], []
    for record in records_a:
        twin = by_id[record["question_id"]]
        turns_a, turns_b = _turns(record, profile), _turns(twin, profile)
        if turns_a is None or turns_b is None:
            return math.nan
        same = [(c["prompt_tokens"], c["new_tokens"]) for c in (record["choices"][0], twin["choices"][0])]
        if same[0] != same[1]:
            raise ValueError(f"oracle_combine: question {record['question_id']} has other prompts or token counts "
                             f"in the two runs {same}: not the same answers")
        seconds.append(sum(a.least_seconds([*a.options(), *b.options()]) for a, b in zip(turns_a, turns_b)))
        vanilla.append(_vanilla(turns_a))
    return speedup_of(_tokens(records_a), seconds, vanilla) if records_a else math.nan


def bounds_row(records: list[dict], profile: Profile | None) -> dict:
    """The report's columns for one method run: best_fixed_k, best_fixed_k_speedup, oracle_speedup (the replayed
    figure is its predicted_speedup); NaN without a profile or step data."""
    bounds = speedup_bounds(records, profile, replayed=False) if profile is not None else None
    if bounds is None:
        return {"best_fixed_k": math.nan, "best_fixed_k_speedup": math.nan, "oracle_speedup": math.nan}
    return {"best_fixed_k": bounds.best_fixed_k, "best_fixed_k_speedup": bounds.best_fixed_k_speedup,
            "oracle_speedup": bounds.oracle}
