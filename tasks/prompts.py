"""How a conversation becomes prompt tokens: the prompt formats (the model's chat template, a plain one, raw)."""
from __future__ import annotations

PROMPT_FORMATS = ("auto", "plain", "raw")


PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] | capitalize + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


RAW_TEMPLATE = "{% for m in messages %}{{ ('\\n\\n' if not loop.first else '') + m['content'] }}{% endfor %}"


def set_prompt_format(tokenizer, prompt_format: str = "auto", chat_template: str | None = None) -> str:
    """Give `tokenizer` the chat template that build_prompt renders with; returns which format that is.

    raw: RAW_TEMPLATE. Otherwise `chat_template` when given, else (auto) the tokenizer's own template, else the
    plain format. The plain and raw formats start with the BOS token where the tokenizer adds one to plain text.
    """
    if prompt_format == "raw":
        template = RAW_TEMPLATE
    elif chat_template:
        tokenizer.chat_template = chat_template
        return "chat_template"
    elif prompt_format == "auto" and tokenizer.chat_template:
        return "chat"
    else:
        template, prompt_format = PLAIN_TEMPLATE, "plain"
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("x").input_ids[:1] == [tokenizer.bos_token_id]
    tokenizer.chat_template = ("{{ bos_token }}" if adds_bos else "") + template
    return prompt_format


def build_prompt(tokenizer, conversation: list[dict]) -> list[int]:
    """Token ids of a chat so far, rendered with the tokenizer's chat template (see set_prompt_format), ready for
    the assistant's reply."""
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids
