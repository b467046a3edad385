"""PARD beside AMD's own inference loop (AMD-AGI/PARD's `pard/pard_infer.py`, `PardInfer.generate --para`, greedy;
sides/pard_driver.py): the same target and PARD draft at our K (conf/method_model/pard) and upstream's
(conf/method/pard.yaml: pard_infer.py's draft_k default); the notes give the share of steps accepting at least 1..3
drafts on each side. Both sides load the same folders: the dequantized target and our draft written out with the
target's embedding (methods/sps/draft.standalone_draft; config in transformers 4's spelling). Two differences in the
loops, not in drafting: upstream drafts already at its prefill (its first target forward verifies K drafts; ours
gives the first token alone), and it decodes past max_new_tokens by up to K tokens (tokens are compared up to
max_new_tokens, forwards counted until they were known)."""
from __future__ import annotations

from pathlib import Path

from bench.parity.environments import Checkout, SideEnvironment, transformers4_folder
from bench.parity.protocol import Comparison, Setup, acceptance_note, counted_outputs, engine_outputs
from bench.parity.sides.upstream_driver import forwards_until_done, running_sums
from methods.sps.draft import standalone_draft

AGAINST = "AMD-AGI/PARD pard_infer.py"
PARD = SideEnvironment("pard-venv", ("loguru==0.7.3", "transformers==4.53.3", "tokenizers==0.21.4",
                                     "huggingface-hub==0.36.2"))
CHECKOUT = Checkout("PARD", "upstream/PARD", "pard/pard_infer.py", "git clone https://github.com/AMD-AGI/PARD {dir}")


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    ours, upstream = setup.knobs("pard"), setup.knobs("pard", upstream=True)
    ks = [ours["num_draft_tokens"], upstream["num_draft_tokens"]]
    job = setup.side_job()
    draft = transformers4_folder(standalone_draft(ours["draft_path"], Path(job["model_dir"])), work / "draft")
    job.update(pard_dir=str(CHECKOUT.path(setup.checkouts)), target_dir=job["model_dir"], draft_dir=str(draft), ks=ks)
    theirs_by_k = PARD.run("pard_driver", job, work)
    rows = []
    for k in ks:
        outs = engine_outputs(setup, setup.drafter("pard", num_draft_tokens=k))
        theirs = theirs_by_k[str(k)]
        # upstream's first step is its prefill: no forward before it
        their_counts = [(r["tokens"], forwards_until_done(running_sums(r["steps"]), r["tokens"]) - 1) for r in theirs]
        note = acceptance_note(f"pard K={k}", outs, [r["steps"] for r in theirs], 3, "pard_infer.py")
        rows.append(Comparison("pard", f"K={k}, {ours['draft_path']} vs AMD-AGI/PARD pard_infer.py --para --nc",
                               counted_outputs(setup, outs), their_counts, [note]))
    return rows
