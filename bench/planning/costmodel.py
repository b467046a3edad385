"""The measured cost model: how long the target's forward takes for L verified tokens, and what that predicts.

- A `Profile` holds t(L, c): the median seconds of one target forward over L new tokens after a cached context of c
  tokens, measured by `python -m bench.profile` on one setting (model, device, dtype, threads, library versions)
  and refused for any other. `forward_seconds` interpolates linearly between the measured L and c (clamped outside).
  Each point is measured twice: as a chain (`seconds`: the model's own causal mask, what chain and one-token steps
  pass) and as a tree step (`tree_seconds`: a tree-shaped 4-D additive mask, what tree steps and every batched step
  pass, so the mask's cost is in it). Profiles made before tree points existed have only `seconds`, used for both.
- `predicted_seconds(record, profile)` / `predicted_speedup(records, profile)`: what a run's own steps should have
  cost on that profile. Each decode step costs t(L_s, c_s) for the L_s tokens it verified at its context length c_s
  (a tree point where the step passed a tree mask), plus the drafting time the run measured; vanilla would have
  paid t(1, c) per token. Both sides keep the run's measured prefill. What this leaves
  out (acceptance, cache compaction, mask building, Python) is the gap between predicted and measured speedup.
- `best_size`: the number of draft nodes that maximises predicted tokens/s given per-node acceptance estimates
  (bench/planning/policy.py's `method.sizing=auto`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POINT_KINDS = {"seconds": "chain: the model's own causal mask",
               "tree_seconds": "tree: a tree-shaped 4-D additive mask (bench/engine/kvcache.py tree_attention_mask)"}


# Keys that profiles once recorded but that do not change forward times: transformers' version (the forward is
# torch's kernels; a patch release of transformers must not leave a fresh install without its predicted speedups).
RETIRED_SETTING_KEYS = ("transformers",)


class ProfileError(Exception):
    """No profile for this setting, or one made for another setting."""


def device_slug(device_name: str) -> str:
    """A device name as a file-name part: `Intel(R) Xeon(R) Processor` -> `intel-xeon-processor`."""
    name = re.sub(r"\((r|tm)\)", "", device_name.lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"


def profile_path(directory: str | Path, setting: dict) -> Path:
    """`<model>-<device><threads>t-<dtype>[-b<batch>][-compiled]-<device name>[-<blas variables>].json`: profiles of
    different CPUs or GPUs (or BLAS code paths: `-mkl_cbwr_avx2`, or engines: `-compiled`) live side by side (a clone
    runs on whichever machine it lands on)."""
    device = setting["device"] if setting["threads"] is None else f"{setting['device']}{setting['threads']}t"
    batch = f"-b{setting['batch']}" if setting.get("batch", 1) > 1 else ""
    blas = "".join(f"-{name.lower()}_{device_slug(value).replace('-', '_')}"
                   for name, value in sorted(setting.get("blas", {}).items()))
    compiled = "-compiled" if setting.get("compiled") else ""
    name = (f"{setting['model']}-{device}-{setting['dtype']}{batch}{compiled}-{device_slug(setting['device_name'])}"
            f"{blas}.json")
    return Path(directory).expanduser() / name


@dataclass
class Profile:
    """t(L, c) on one setting: seconds[i][j] for contexts[i] and lengths[j], chains; tree_seconds alike, tree steps
    (None in profiles made before tree points existed); point_kinds says in the JSON which table is which; host: the
    host name it was measured on (None in profiles made before they recorded it)."""

    setting: dict
    lengths: list[int]
    contexts: list[int]
    seconds: list[list[float]]
    repeats: int = 0
    measured: str = ""
    tree_seconds: list[list[float]] | None = None
    point_kinds: dict | None = None
    host: str | None = None

    def forward_seconds(self, length: float, context: float, tree: bool = False) -> float:
        """t(L, c) of a chain step (or, with `tree`, of a step with a tree mask), bilinear between the measured sizes
        and contexts, clamped to the measured range."""
        table = self.tree_seconds if tree and self.tree_seconds is not None else self.seconds
        per_context = [np.interp(length, self.lengths, row) for row in table]
        return float(np.interp(context, self.contexts, per_context))

    def relative(self, context: int | None = None) -> list[float]:
        """t(L) / t(1) for each measured L, at `context` (default: the shortest measured)."""
        c = self.contexts[0] if context is None else context
        one = self.forward_seconds(1, c)
        return [self.forward_seconds(length, c) / one for length in self.lengths]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, setting: dict, command: str) -> "Profile":
        """The profile at `path`, refused (ProfileError naming `command`) when missing or made for another setting."""
        if not path.exists():
            raise ProfileError(f"no forward-time profile for this setting at {path}; make it with: {command}")
        data = json.loads(path.read_text())
        for key in RETIRED_SETTING_KEYS:  # profiles made before a key was retired still serve their setting
            data["setting"].pop(key, None)
        if data["setting"] != setting:
            changed = sorted(k for k in setting if data["setting"].get(k) != setting[k])
            raise ProfileError(f"the profile at {path} was made for another setting ({', '.join(changed)} differ); "
                               f"remake it with: {command} profile.force=true")
        return cls(**data)


# --- predictions from a run's records ----------------------------------------------------------------------------

def turn_contexts(prompt_tokens: int, accept_lengths: list[int]) -> list[int]:
    """The cached context length before each decode step of a turn: the prompt plus the tokens decoded so far but
    the last (the step's root, verified in it); accept_lengths holds the decode steps' (the prefill's token is the
    first step's root)."""
    contexts, length = [], prompt_tokens
    for accepted in accept_lengths:
        contexts.append(length)
        length += accepted
    return contexts


def predicted_seconds(record: dict, profile: Profile) -> tuple[float, float] | None:
    """(method seconds, vanilla seconds) that the profile predicts for a record's turns, or None when the record
    lacks step data (older runs). Method: measured prefill + measured drafting + sum of t(L_s, c_s), a tree point
    for the steps `tree_steps` marks (records without it: chains). Vanilla: the same prefill + t(1, c) for every
    token after the first."""
    choice = record["choices"][0]
    if "verified_tokens" not in choice or "prompt_tokens" not in choice:
        return None
    method = vanilla = 0.0
    start = 0
    for turn, steps in enumerate(choice["decoding_steps"]):
        accepts = choice["accept_lengths"][start : start + steps]
        start += steps
        phases = choice["phase_times"][turn]
        prompt, new_tokens = choice["prompt_tokens"][turn], choice["new_tokens"][turn]
        verified = choice["verified_tokens"][turn]
        trees = choice["tree_steps"][turn] if "tree_steps" in choice else [False] * len(verified)
        steps = zip(verified, turn_contexts(prompt, accepts), trees)
        method += phases["prefill"] + phases["draft"] + sum(profile.forward_seconds(n, c, t) for n, c, t in steps)
        vanilla += phases["prefill"] + sum(profile.forward_seconds(1, prompt + j) for j in range(new_tokens - 1))
    return method, vanilla


def speedup_of(tokens: list[int], method_seconds: list[float], vanilla_seconds: list[float]) -> float:
    """Per record tokens and seconds -> speedup, aggregated as the measured one is: mean tokens/s of the method over
    mean tokens/s of vanilla."""
    tokens = np.asarray(tokens, dtype=float)
    method = tokens / np.maximum(np.asarray(method_seconds, dtype=float), 1e-12)
    return float(np.mean(method) / np.mean(tokens / np.maximum(np.asarray(vanilla_seconds, dtype=float), 1e-12)))


def predicted_speedup(records: list[dict], profile: Profile) -> float:
    """The speedup the profile predicts for these records (`speedup_of`); NaN when a record has no step data."""
    seconds = [predicted_seconds(record, profile) for record in records]
    if not records or any(s is None for s in seconds):
        return float("nan")
    return speedup_of([sum(r["choices"][0]["new_tokens"]) for r in records], *zip(*seconds))


def best_size(accept_probs: list[float], context: int, profile: Profile, aux: int = 0,
              draft_seconds: float | list[float] = 0.0, tree: bool = False) -> tuple[int, float]:
    """(k, predicted tokens/s) for verifying the first k draft nodes: each step gives 1 + sum(accept_probs[:k])
    tokens (node i accepted with probability accept_probs[i]; parents come first, so the kept nodes' accepted path
    is the full tree's, cut) and costs t(1 + k + aux, context) + draft_seconds (tree points with `tree`):
    one figure for any k, or a list by k (0 .. len(accept_probs)) for a drafter that drafts only the nodes kept."""
    best, best_rate, expected = 0, 0.0, 1.0
    for k in range(len(accept_probs) + 1):
        if k:
            expected += accept_probs[k - 1]
        drafting = draft_seconds[k] if isinstance(draft_seconds, list) else draft_seconds
        rate = expected / (profile.forward_seconds(1 + k + aux, context, tree) + drafting)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate
