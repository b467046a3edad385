"""One endpoint of a server run (the speculative server's, or its baseline's without speculation): answering a question
turn by turn over HTTP as our engine does (turn k asked with turns < k and this side's answers), each turn's record
fields (records.answer_record's, plus the serving ones), and its acceptance counters."""
from __future__ import annotations

import sys
import urllib.error

from bench.errors import ConfigError
from bench.measure.serving import acceptance
from bench.measure.serving.acceptance import SpecCounters
from bench.measure.serving.engine_counters import from_tgi_steps, read_counters, reads_counters
from bench.measure.serving.http import ServerError, get_text, unreachable
from bench.measure.serving.stream import TEXT_PROMPTS, RequestSpec, StreamedTurn, stream_turn
from tasks.prompts import build_prompt

SERVER_KEYS = ("ttft_s", "itl_s", "token_count_source", "acceptance_source", "drafted", "accepted")


class ServerEndpoint:
    """`url` (its `setting`, e.g. server.url, named in errors), asked with `spec`; `speculative` says whether it
    speculates; `engine` which counters it keeps; `per_turn_counters` reads /metrics around every request (only at
    concurrency 1, where nothing else runs on it)."""

    def __init__(self, url: str, setting: str, spec: RequestSpec, tokenizer, engine: str, speculative: bool,
                 metrics_path: str | None, per_turn_counters: bool):
        self.url, self.setting, self.spec, self.tokenizer = url.rstrip("/"), setting, spec, tokenizer
        self.engine, self.speculative, self.metrics_path = engine, speculative, metrics_path
        self.counted = reads_counters(engine)
        self.per_turn_counters = per_turn_counters and speculative and self.counted

    def probe(self, health_path: str) -> None:
        """MissingArtifactError naming the url and its setting when nothing listens there (any HTTP answer will do)."""
        try:
            get_text(self.url + health_path, timeout=10.0)
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError) as err:
            raise unreachable(self.url, err, self.setting) from err

    def counters(self) -> SpecCounters | None:
        """The server's speculation counters now (None: no /metrics, or none of this engine's there)."""
        if not self.speculative or not self.metrics_path or not self.counted:
            return None
        try:
            return read_counters(self.engine, self.url + self.metrics_path, timeout=10.0)
        except (urllib.error.URLError, OSError) as err:
            print(f"WARNING: cannot read {self.url}{self.metrics_path} ({err}); no acceptance counters "
                  f"(server.metrics_path=null stops trying)", file=sys.stderr)
            self.metrics_path = None
            return None

    def ask(self, prompt_ids: list[int], conversation: list[dict], seed: int,
            max_tokens: int | None = None) -> StreamedTurn:
        """One streamed request; errors become one-line messages naming the url and the setting to fix."""
        spec = self.spec if max_tokens is None else RequestSpec(**{**self.spec.__dict__, "max_tokens": max_tokens})
        prompt_text = self.tokenizer.decode(prompt_ids) if spec.endpoint in TEXT_PROMPTS else ""
        body = spec.body(prompt_ids, prompt_text, conversation, seed)
        try:
            return stream_turn(self.url, spec, body)
        except ServerError as err:
            raise ConfigError(f"{err} (server.endpoint={spec.endpoint}, server.extra_body, server.model: does the "
                              f"server take this request?)") from err
        except (urllib.error.URLError, OSError) as err:
            raise unreachable(self.url, err, self.setting) from err

    def answer(self, question: dict, seed: int) -> list[dict]:
        """The question's turns, each asked with the earlier turns and this side's answers."""
        conversation, turns = [], []
        for index, user_turn in enumerate(question["turns"]):
            conversation.append({"role": "user", "content": user_turn})
            prompt = build_prompt(self.tokenizer, conversation)
            before = self.counters() if self.per_turn_counters else None
            streamed = self.ask(prompt, conversation, seed + index)
            after = self.counters() if before is not None else None
            turn = self.turn_fields(streamed, prompt, None if after is None else after - before)
            conversation.append({"role": "assistant", "content": turn["text"]})
            turns.append(turn)
        return turns

    def turn_fields(self, streamed: StreamedTurn, prompt: list[int], delta: SpecCounters | None) -> dict:
        """A turn's record fields: the engine's token ids (else our tokenizer's count of its text, said so), the
        latencies, and acceptance as this engine reports it."""
        ids, source = streamed.token_ids, "engine"
        if ids is None:
            ids, source = self.tokenizer(streamed.text, add_special_tokens=False).input_ids, "tokenized_text"
        n = len(ids)
        if not self.speculative:
            found = acceptance.no_speculation(n)
        elif self.engine == "llamacpp":
            found = acceptance.from_timings(n, streamed.timings)
            counted = acceptance.from_counters(n, delta, "llamacpp_metrics")
            if found and counted and counted["accepted"] == found["accepted"] and counted["accept_lengths"]:
                found = counted  # its /metrics agree with the response's timings, and add the per-step lengths
        elif self.engine == "vllm" and streamed.spec_metrics:
            found = acceptance.from_vllm_request(n, streamed.spec_metrics)
        elif self.engine == "sglang":
            found = acceptance.from_sglang_meta(n, streamed.meta_info)
        elif self.engine == "tgi":
            found = from_tgi_steps(n, delta)
        else:
            found = acceptance.from_counters(n, delta, f"{self.engine}_metrics")
        found = found or acceptance.unreported()
        return {"text": streamed.text.strip(), "token_ids": ids, "prompt_ids": prompt, "prompt_tokens": len(prompt),
                "wall_time": streamed.e2e, "wall_times": [streamed.e2e], "latency": streamed.e2e,
                "ttft_s": streamed.ttft, "itl_s": streamed.itl, "token_count_source": source,
                "drafted": found.get("drafted"), "accepted": found.get("accepted"), **found}
