"""Lookahead beside lade 0.0.2's LookaheadDecoding (sides/upstream_driver.py): ours at its defaults, and with the
knobs that do as lade does (conf/method/lookahead.yaml) at each of lade's two ALWAYS_FWD_ONE settings."""
from __future__ import annotations

from pathlib import Path

from bench.parity.environments import UPSTREAM_PACKAGES
from bench.parity.protocol import Comparison, Setup, counted_outputs, engine_outputs, knob_text

AGAINST = "lade 0.0.2"
LADE = {"initial_window": "upstream", "max_accept": "n_minus_1", "seed": 10}  # lade seeds Python's random with 10
ROWS = (("ours (defaults) vs lade default ALWAYS_FWD_ONE=1", {}, 1),  # (label, our knobs, lade's ALWAYS_FWD_ONE)
        ("upstream knobs, slide=one vs lade ALWAYS_FWD_ONE=1", {**LADE, "slide": "one"}, 1),
        ("upstream knobs, slide=accepted vs lade ALWAYS_FWD_ONE=0", {**LADE, "slide": "accepted"}, 0))


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    knobs = setup.knobs("lookahead")
    window = {key: knobs[key] for key in ("window_size", "ngram_size", "guess_set_size")}
    runs = [{"method": "lookahead", **window, "always_fwd_one": fwd_one} for _, _, fwd_one in ROWS]
    theirs = UPSTREAM_PACKAGES.runs("upstream_driver", setup.side_job(), runs, work)
    return [Comparison("lookahead", f"{knob_text(window)}, {label}",
                       counted_outputs(setup, engine_outputs(setup, setup.drafter("lookahead", **ours))),
                       [(r["tokens"], r["steps"]) for r in upstream])
            for (label, ours, _), upstream in zip(ROWS, theirs)]
