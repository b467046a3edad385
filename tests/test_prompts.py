"""Prompt formats: the model's chat template, the plain format for models without one, raw turns; and a base model
(no chat template, sliding-window attention) through the whole CLI path."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bench.measure.run import run
from bench.records import read_jsonl
from tasks.prompts import build_prompt, set_prompt_format
from tests.conftest import WINDOW

CONVERSATION = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another one?"}]


@pytest.fixture
def base_tokenizer(base_checkpoint):
    return AutoTokenizer.from_pretrained(base_checkpoint)


def rendered(tokenizer, conversation) -> str:
    return tokenizer.decode(build_prompt(tokenizer, conversation))


def test_plain_format_without_a_chat_template(base_tokenizer):
    assert base_tokenizer.chat_template is None
    assert set_prompt_format(base_tokenizer) == "plain"
    assert rendered(base_tokenizer, CONVERSATION) == (
        "<bos>User: Name a colour.\n\nAssistant: Blue.\n\nUser: Another one?\n\nAssistant:")


def test_raw_format_sends_the_user_turn_as_is(base_tokenizer):
    assert set_prompt_format(base_tokenizer, "raw") == "raw"
    turn = CONVERSATION[0]["content"]
    assert build_prompt(base_tokenizer, CONVERSATION[:1]) == base_tokenizer(turn).input_ids  # BOS included
    assert rendered(base_tokenizer, CONVERSATION) == "<bos>Name a colour.\n\nBlue.\n\nAnother one?"


def test_chat_templates_own_and_configured(base_tokenizer, tiny_checkpoint):
    assert set_prompt_format(base_tokenizer, "auto", "{% for m in messages %}[{{ m['content'] }}]{% endfor %}") == \
        "chat_template"
    assert rendered(base_tokenizer, CONVERSATION) == "[Name a colour.][Blue.][Another one?]"
    chat = AutoTokenizer.from_pretrained(tiny_checkpoint)
    own = chat.chat_template
    assert set_prompt_format(chat) == "chat" and chat.chat_template == own
    assert set_prompt_format(chat, "plain") == "plain"
    assert rendered(chat, CONVERSATION[:1]) == "User: Name a colour.\n\nAssistant:"  # this tokenizer adds no BOS


@pytest.mark.parametrize("method", ["pld", "lookahead"])
def test_base_model_with_sliding_window_runs_losslessly(compose, base_checkpoint, tmp_path, capsys, method):
    """No chat template (the plain format, said once), attention window shorter than every prompt, multi-turn."""
    cfg = compose(f"method={method}", "task=all", "task.tasks=[mt_bench,qa]", "task.limit=1",
                  checkpoint=base_checkpoint)
    summary = run(cfg)
    assert capsys.readouterr().err.count("has no chat template; prompts use the plain format") == 1
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert [a["category"] for a in answers] == ["writing", "qa"] and len(answers[0]["choices"][0]["turns"]) == 2
    assert all(a["exact_match"] for a in answers) and summary.exact_match.tolist() == [1.0, 1.0, 1.0]
    assert min(len(t) for a in answers for t in a["choices"][0]["token_ids"]) > 0
    assert WINDOW < 20  # every Spec-Bench prompt is longer than the window
