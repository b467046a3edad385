"""bench/parity: the protocol's pure parts (Spec-Bench's prompt order, forwards counted from accept lengths, a row of
the table and its record, per-position acceptance shares, the missing checkouts' messages), the protocol on a tiny
target (knobs composed from conf/, our engine's outputs, the divergence found as bench/measure finds it), the side
environments' job files, the parity files found by folder scan, and what the method files compare (SAM-Decoding's
tree file as choices, ReDrafter's beam agreement, MLPSpeculator's drafts and summaries, vLLM's greedy rule)."""
import ast
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.engine.loop import StopCondition
from bench.parity.__main__ import parity_files, write_records
from bench.parity.environments import SPEC_BENCH_CHECKOUT, SideEnvironment
from bench.parity.methods.mlp_speculator import run_summary, same_drafts
from bench.parity.methods.pard import CHECKOUT as PARD_CHECKOUT
from bench.parity.methods.redrafter import beam_agreement
from bench.parity.methods.samd import recycle_tree_choices, tree_note
from bench.parity.protocol import (
    Comparison,
    Setup,
    acceptance_note,
    acceptance_shares,
    counted_output,
    counted_outputs,
    decode_step_lengths,
    engine_outputs,
    generate_recording,
    knob_text,
)
from bench.parity.sides.mlp_speculator_driver import greedy_chain_verdict
from bench.parity.sides.upstream_driver import forwards_until_done, running_sums, spec_bench_order
from methods.recycling import TEMPLATES

TREE_ADJ = {"0": [1, 2, 3], "1": [4, 5], "2": [6], "3": [], "4": [7], "5": [], "6": [], "7": []}
TREE_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_spec_bench_order_warms_up_on_both_turns_of_the_first_question_uncounted():
    prompts = [[1], [2], [3], [4]]
    assert spec_bench_order(prompts, 2) == [(False, [1]), (False, [2]), (False, [1]), (False, [2]),
                                            (True, [1]), (True, [2]), (True, [3]), (True, [4])]
    assert spec_bench_order(prompts, 0) == [(True, p) for p in prompts]


def test_forwards_until_done_counts_the_prefill_and_the_steps_until_every_token_was_known():
    # Token Recycling: step s makes accept_lengths[s] tokens known
    assert running_sums([3, 3, 2, 2, 6, 2]) == [3, 6, 8, 10, 16, 18]
    assert forwards_until_done(running_sums([3, 3, 2, 2, 6, 2]), list(range(16))) == 6
    # SAM-Decoding: the prefill already picked the first root
    assert running_sums([2, 3, 2, 2, 5, 3], start=1) == [3, 6, 8, 10, 15, 18]
    assert forwards_until_done(running_sums([2, 3, 2, 2, 5, 3], start=1), list(range(16))) == 7
    # cut at EOS: done as soon as the EOS was known
    assert forwards_until_done([2, 6, 9], [5, 6, 7, 8, 2]) == 3


def test_recycle_tree_choices_reads_children_in_rank_order_level_by_level():
    assert recycle_tree_choices(TREE_ADJ) == TREE_CHOICES


def test_knob_text_writes_overrides_with_trees_by_size():
    assert knob_text({"k": 8, "template": [[0], [1]], "carry_over": True}, "recycling.") == (
        "recycling.k=8 recycling.template=<2 choices> recycling.carry_over=true")


def test_decode_step_lengths_leave_out_the_prefill_whether_or_not_the_engine_books_it():
    assert decode_step_lengths(SimpleNamespace(tokens=[5, 6, 7, 8], accept_lengths=[1, 2, 1])) == [2, 1]
    assert decode_step_lengths(SimpleNamespace(tokens=[5, 6, 7, 8], accept_lengths=[2, 1])) == [2, 1]


def test_counted_output_cuts_at_max_new_tokens_and_counts_forwards_until_then():
    out = SimpleNamespace(tokens=[5, 6, 7, 8, 9, 10], accept_lengths=[1, 3, 2])  # the prefill's token booked
    assert counted_output(out, 4) == ([5, 6, 7, 8], 2)  # the prefill (1 known), step 1 (4 known)
    assert counted_output(out, 6) == ([5, 6, 7, 8, 9, 10], 3)


def test_samd_recycling_fallback_is_spec_benchs_tree_carried_over_and_a_different_tree_is_noted(tmp_path):
    knobs = compose_config("method=samd").method.drafter.recycling
    assert (knobs.k, knobs.template, knobs.carry_over, knobs.seed_from_prefill) == (8, "samd", True, True)
    (tmp_path / "model" / "samd" / "config").mkdir(parents=True)
    tree_file = tmp_path / "model" / "samd" / "config" / "token_recycle.json"
    tree_file.write_text(json.dumps({"tree_adj": TREE_ADJ}))
    assert tree_note(tmp_path, knobs) == " (TEMPLATES['samd'] is not token_recycle.json's tree)"
    tree_file.write_text(json.dumps({"tree_adj": tree_adj(TEMPLATES["samd"])}))  # upstream's tree is ours
    assert tree_note(tmp_path, knobs) == ""


def tree_adj(choices: list[list[int]]) -> dict[str, list[int]]:
    """Choices (breadth-first) as token_recycle.json's adjacency: node ids in that order, the root 0."""
    ids, adjacency = {(): 0}, {"0": []}
    for number, path in enumerate(choices, start=1):
        ids[tuple(path)] = number
        adjacency[str(number)] = []
        adjacency[str(ids[tuple(path[:-1])])].append(number)
    return adjacency


def test_a_missing_checkout_says_how_to_get_it_or_where_to_name_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as stop:
        SPEC_BENCH_CHECKOUT.path({"spec-bench": str(tmp_path / "nowhere")})
    assert str(stop.value) == (f"no model/samd/samd_model.py in {tmp_path / 'nowhere'}: git clone "
                               f"https://github.com/hemingkx/Spec-Bench {tmp_path / 'nowhere'} (or --checkout "
                               "spec-bench=DIR)")
    with pytest.raises(SystemExit) as stop:
        PARD_CHECKOUT.path({})
    default = tmp_path / "cache" / "upstream" / "PARD"
    assert str(stop.value) == (f"no pard/pard_infer.py in {default}: git clone https://github.com/AMD-AGI/PARD "
                               f"{default} (or --checkout PARD=DIR)")
    (default / "pard").mkdir(parents=True)
    (default / "pard" / "pard_infer.py").write_text("")
    assert PARD_CHECKOUT.path({}) == default


def test_a_comparison_row_gives_both_mats_their_difference_and_the_first_divergence():
    row = Comparison("pard", "K=2", ours=[([1, 2, 3], 2), ([4, 5, 6, 7, 8], 4)], theirs=[([1, 2, 3], 3), ([4, 5], 1)])
    assert row.line() == "| pard | K=2 | 1.333 | 1.250 | +6.7% | no (prompt 1, token 2) |"
    assert {k: v for k, v in row.record().items() if k != "notes"} == {
        "method": "pard", "settings": "K=2", "prompts": 2, "our_mat": 1.3333, "upstream_mat": 1.25,
        "difference": 0.0667, "tokens_equal": False, "divergence_prompt": 1, "divergence_token": 2,
        "numeric_tie": False, "tie_distance": None}
    same = Comparison("dflash", "block 16", ours=[([1, 2], 2)], theirs=[([1, 2], 2)], notes=["a", "b"])
    assert same.line() == "| dflash | block 16 | 1.000 | 1.000 | +0.0% | yes |"
    assert same.record()["tokens_equal"] is True and same.record()["notes"] == "a | b"


def test_acceptance_shares_count_steps_accepting_at_least_each_position():
    # tokens per step 1, 2, 3, 1 (the bonus token included): 0, 1, 2, 0 drafts accepted
    assert acceptance_shares([[1, 2], [3, 1]], 3) == "0.500 / 0.250 / 0.000"
    assert acceptance_shares([], 2) == "0.000 / 0.000"
    ours = [SimpleNamespace(tokens=[1, 2, 3, 4], accept_lengths=[1, 3])]  # one step accepting 2 drafts
    assert acceptance_note("pard K=2", ours, [[2, 1]], 2, "pard_infer.py") == (
        "pard K=2: steps accepting >= 1 / 2 drafts: ours 1.000 / 1.000, pard_infer.py 0.500 / 0.000")


def test_beam_agreement_compares_first_beams_and_beams_where_both_drafted():
    ours = [{1: [[1, 2]], 3: [[3, 4]], 5: [[5, 6]]}, {1: [[7, 8]]}]
    theirs = [{1: [[1, 2]], 3: [[3, 9]], 4: [[4, 4]]}, {1: [[7, 0]]}]
    assert beam_agreement("4 x 4", ours, theirs) == ("redrafter 4 x 4: first beams equal 1/2, beams equal where both "
                                                     "drafted 1/3")


def test_generate_recording_keys_the_kept_searches_by_new_tokens_known_and_restores_the_drafter():
    import torch

    class Drafter:
        def propose(self, context, max_tokens):
            return [self.beams(context[-1], 2), self.beams(context[-1], 1)]

        def beams(self, root, length):
            return torch.full((1, length), root)

    class Engine:
        def generate(self, prompt, stop):
            return [drafter.propose(prompt + [7] * n, 4) for n in (0, 3)]

    drafter = Drafter()
    out, drafted = generate_recording(Engine(), drafter, [5], None, "beams", keep=lambda length: length == 2)
    assert drafted == {0: [[5, 5]], 3: [[7, 7]]}
    assert len(out) == 2 and out[1][1].tolist() == [[7]]
    assert "propose" not in vars(drafter) and "beams" not in vars(drafter)


# --- the protocol on a tiny target -------------------------------------------------------------------------------

@pytest.fixture
def tiny_setup(tiny_model, prompts):
    return Setup("smollm2_135m", tiny_model, None, OmegaConf.create({"tie_margin": 0.0}), prompts[:2],
                 StopCondition(10, frozenset()))


def test_knobs_are_composed_from_conf_per_model_or_as_the_methods_upstream_defaults(tiny_setup):
    assert tiny_setup.knobs("pard")["num_draft_tokens"] == 2  # conf/method_model/pard/smollm2_135m.yaml
    assert tiny_setup.knobs("pard", upstream=True)["num_draft_tokens"] == 12  # conf/method/pard.yaml
    assert [tiny_setup.knobs("redrafter", upstream=True)[k] for k in ("beam_width", "beam_length")] == [45, 5]
    assert "_target_" not in tiny_setup.knobs("suffix")


def test_our_side_is_the_harness_drafter_and_a_divergence_is_judged_on_the_target(tiny_setup):
    """PLD as the harness builds it (conf/method/pld.yaml, a knob replaced) is lossless against vanilla on the tiny
    target; a changed upstream token is found where bench/measure finds it, and judged on our target."""
    pld = engine_outputs(tiny_setup, tiny_setup.drafter("pld", num_pred_tokens=3))
    vanilla = engine_outputs(tiny_setup, lambda: None)
    ours, theirs = counted_outputs(tiny_setup, pld), counted_outputs(tiny_setup, vanilla)
    assert Comparison("pld", "", ours, theirs).record(tiny_setup)["tokens_equal"] is True
    changed = [(list(tokens), forwards) for tokens, forwards in theirs]
    changed[1][0][4] = (changed[1][0][4] + 1) % 16
    record = Comparison("pld", "", ours, changed).record(tiny_setup)
    assert (record["tokens_equal"], record["divergence_prompt"], record["divergence_token"]) == (False, 1, 4)
    assert record["numeric_tie"] is False and record["tie_distance"] > 0


def test_a_side_environment_runs_a_driver_by_path_on_a_job_each_equal_run_once(tmp_path, monkeypatch):
    import bench.parity.environments as environments

    (tmp_path / "sides").mkdir()
    (tmp_path / "sides" / "echo_driver.py").write_text(
        "import json, os, sys\n"
        "job = json.load(open(sys.argv[1]))\n"
        "out = {r['name']: [r['value'], len(job['runs']), os.getcwd()] for r in job['runs']}\n"
        "json.dump(out, open(sys.argv[2], 'w'))\n")
    monkeypatch.setattr(environments, "SIDES", tmp_path / "sides")
    monkeypatch.setattr(SideEnvironment, "python", lambda self: Path(sys.executable))
    runs = SideEnvironment("none", ()).runs("echo_driver", {"prompts": []}, [{"value": 1}, {"value": 2},
                                                                            {"value": 1}], tmp_path / "work")
    assert runs == [[1, 2, str(PROJECT_ROOT)], [2, 2, str(PROJECT_ROOT)], [1, 2, str(PROJECT_ROOT)]]
    assert json.loads((tmp_path / "work" / "echo_driver.json").read_text())["prompts"] == []


def test_the_parity_files_are_found_by_folder_scan_and_each_declares_what_it_compares():
    files = parity_files()
    methods = {path.stem for path in (PROJECT_ROOT / "conf" / "method").glob("*.yaml")}
    assert set(files) <= methods and {"lookahead", "pard", "suffix", "mlp_speculator"} <= set(files)
    assert "?" not in files.values()
    for name in files:
        tree = ast.parse((PROJECT_ROOT / "bench" / "parity" / "methods" / f"{name}.py").read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert ast.get_docstring(tree) and "comparisons" in functions, name


def test_no_method_registry_of_if_chains_in_the_code():
    chains = [f"{path.relative_to(PROJECT_ROOT)}:{number}" for folder in ("bench", "methods")
              for path in (PROJECT_ROOT / folder).rglob("*.py")
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r'if "[a-z0-9_]+" in methods', line)]
    assert chains == []


def test_records_replace_the_rows_of_the_methods_run_and_keep_the_others(tmp_path):
    path = tmp_path / "smollm2_135m" / "parity.csv"
    first = [{"parity_file": "pard", "method": "pard", "settings": "K=2"},
             {"parity_file": "samd", "method": "samd[eagle2]", "settings": "x"}]
    write_records(path, first, {"pard", "samd"})
    write_records(path, [{"parity_file": "pard", "method": "pard", "settings": "K=12"}], {"pard"})
    lines = path.read_text().splitlines()
    assert lines[0].startswith("parity_file,method,settings,questions,prompts,max_new_tokens,our_mat,upstream_mat")
    assert lines[0].endswith(",notes,date")
    assert [line.split(",")[:3] for line in lines[1:]] == [["samd", "samd[eagle2]", "x"], ["pard", "pard", "K=12"]]


# --- MLPSpeculator's sides: vLLM's greedy rule for a chain, the drafts compared where both drafted as deep --------

def test_greedy_chain_verdict_keeps_drafts_until_the_first_mismatch_then_the_targets_token():
    assert greedy_chain_verdict([5, 7, 9], [5, 7, 1, 4]) == [5, 7, 1]
    assert greedy_chain_verdict([5, 7, 9], [6, 7, 9, 4]) == [6]
    assert greedy_chain_verdict([5, 7, 9], [5, 7, 9, 4]) == [5, 7, 9, 4]  # all kept: the bonus token
    assert greedy_chain_verdict([], [3]) == [3]


def test_same_drafts_compares_only_points_both_sides_drafted_as_deep():
    ours = [{"drafts": {1: [[4, 5, 6]], 3: [[7, 8, 9]], 9: [[1]]}}, {"drafts": {1: [[2, 2, 2], [2, 3, 4]]}}]
    theirs = [{"drafts": {1: [[4, 5, 6]], 3: [[7, 8, 0]], 5: [[1, 1, 1]], 9: [[1, 2, 3]]}},
              {"drafts": {1: [[2, 3, 4], [2, 2, 2]]}}]  # same sequences, another order: not equal
    assert same_drafts(ours, theirs) == (1, 3)


def test_a_side_summary_counts_forwards_until_done_and_steps_accepting_each_position():
    # 1 + 3 + 1 + 2 = 7 tokens after 4 forwards (the prefill's token, then three steps); steps accept 2, 0, 1 drafts
    run = {"tokens": [1, 2, 3, 4, 5, 6, 7], "steps": [3, 1, 2], "drafts": {1: [[2, 3, 9]], 4: [[8, 8, 8]]}}
    other = {**run, "tokens": [1, 2, 3, 4, 5, 6, 0], "drafts": {1: [[2, 3, 9]], 4: [[5, 8, 8]]}}
    assert run_summary("ours", [run], [run], 3) == (
        "ours: #MAT 1.750, steps accepting >= 1 / 2 / 3 drafts 0.667 / 0.333 / 0.000, tokens equal to ours yes, "
        "drafts equal to ours (where both drafted as deep) 2/2")
    assert run_summary("them", [other], [run], 3) == (
        "them: #MAT 1.750, steps accepting >= 1 / 2 / 3 drafts 0.667 / 0.333 / 0.000, tokens equal to ours no "
        "(prompt 0, token 6), drafts equal to ours (where both drafted as deep) 1/2")
