"""One request to a serving engine, streamed and timed: the request body for each endpoint kind, and what the
stream says (text, the engine's token ids where it gives them, llama.cpp's timings) with its times."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from bench.measure.serving.http import post_stream

ENDPOINT_PATHS = {"completions": "/v1/completions", "completions_text": "/v1/completions",
                  "chat": "/v1/chat/completions", "llamacpp": "/completion", "sglang": "/generate",
                  "tgi": "/generate_stream", "lmdeploy": "/generate"}
TEXT_PROMPTS = ("completions_text", "tgi")  # endpoints asked with our rendering as text (TGI takes no token ids)


@dataclass
class StreamedTurn:
    """What one streamed request gave: `token_ids` None where the engine sent only text; seconds from sending to
    the first token (ttft), between token-carrying events (itl) and to the end (e2e)."""

    text: str = ""
    token_ids: list[int] | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    timings: dict | None = None  # llama.cpp's per-response timings (draft_n, draft_n_accepted, predicted_n...)
    meta_info: dict | None = None  # SGLang's per-request meta_info, as its last event had it (spec_verify_ct...)
    spec_metrics: dict | None = None  # vLLM's per-request metrics.speculative_decoding (its usage chunk)
    finish_reason: str | None = None


@dataclass
class RequestSpec:
    """How to ask one endpoint: its kind (ENDPOINT_PATHS), the model name sent, sampling and stop settings, and
    engine-specific body fields (server.extra_body)."""

    endpoint: str
    model: str | None
    max_tokens: int
    temperature: float
    stop: list[str]
    extra: dict = field(default_factory=dict)
    timeout: float = 600.0

    def body(self, prompt_ids: list[int], prompt_text: str, messages: list[dict], seed: int) -> dict:
        """The JSON body of one turn: the prompt as token ids (completions, llamacpp), as our rendered text
        (completions_text), as the chat so far (chat, templated by the server), as SGLang's native request
        (input_ids and sampling_params; no seed: its name differs across SGLang versions), as TGI's (our text as
        `inputs`, tgi_parameters) or as LMDeploy's /generate (input_ids, sampling fields at the top)."""
        if self.endpoint == "sglang":
            sampling = {"max_new_tokens": self.max_tokens, "temperature": self.temperature, "stop": self.stop}
            return {"input_ids": prompt_ids, "sampling_params": sampling, "stream": True, **self.extra}
        if self.endpoint == "tgi":
            return {"inputs": prompt_text, "parameters": self.tgi_parameters(seed)}
        if self.endpoint == "lmdeploy":  # its /generate has no seed field
            return {"input_ids": prompt_ids, "max_tokens": self.max_tokens, "temperature": self.temperature,
                    "stop": self.stop, "stream": True, **self.extra}
        common = {"stream": True, "temperature": self.temperature, "stop": self.stop, "seed": seed, **self.extra}
        if self.endpoint == "llamacpp":
            return {"prompt": prompt_ids, "n_predict": self.max_tokens, "return_tokens": True, **common}
        named = {"model": self.model} if self.model else {}
        if self.endpoint == "chat":
            return {**named, "messages": messages, "max_tokens": self.max_tokens, **common}
        prompt = prompt_text if self.endpoint == "completions_text" else prompt_ids
        return {**named, "prompt": prompt, "max_tokens": self.max_tokens, **common}

    def tgi_parameters(self, seed: int) -> dict:
        """TGI's `parameters` (router/src/lib.rs GenerateParameters), server.extra_body among them: greedy is
        do_sample false without a temperature (it refuses temperature 0); `details` for the finish reason."""
        sampled = {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {"do_sample": False}
        return {"max_new_tokens": self.max_tokens, "stop": self.stop, "seed": seed, "details": True, **sampled,
                **self.extra}


def event_tokens(event: dict, sent: tuple[str, list[int]] = ("", [])) -> tuple[str, list[int] | None]:
    """(text, token ids or None) that one streamed event adds, for any endpoint kind: SGLang's `text` and
    `output_ids` (the whole output so far, so `sent` is cut off, unless the server streams increments, seen as
    `output_ids` shorter than meta_info's completion_tokens, as LMDeploy's /generate does); TGI's one `token` (`id`,
    and its `text` unless `special`, as TGI's generated_text leaves special tokens out); llama.cpp's `content`
    and `tokens`; OpenAI's choices[0] `text` or `delta.content`, with `token_ids` (vLLM's return_token_ids) or
    logprobs tokens written `token_id:<n>` (vLLM's return_tokens_as_token_ids)."""
    if "output_ids" in event:  # SGLang's /generate
        ids, text = [int(t) for t in event["output_ids"]], event.get("text") or ""
        if len(ids) == (event.get("meta_info") or {}).get("completion_tokens", len(ids)) and len(ids) >= len(sent[1]):
            return text[len(sent[0]):] if text.startswith(sent[0]) else text, ids[len(sent[1]):]
        return text, ids
    if isinstance(event.get("token"), dict):  # TGI's /generate_stream
        token = event["token"]
        return "" if token.get("special") else token.get("text") or "", [int(token["id"])]
    if "content" in event or "tokens" in event:  # llama.cpp's /completion
        tokens = event.get("tokens")
        return event.get("content") or "", None if tokens is None else [int(t) for t in tokens]
    choices = event.get("choices") or [{}]
    choice = choices[0]
    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    if choice.get("token_ids") is not None:
        return text, [int(t) for t in choice["token_ids"]]
    logged = (choice.get("logprobs") or {}).get("tokens")
    if logged and all(isinstance(t, str) and t.startswith("token_id:") for t in logged):
        return text, [int(t.removeprefix("token_id:")) for t in logged]
    return text, None


def stream_turn(url: str, spec: RequestSpec, body: dict) -> StreamedTurn:
    """Send one request and read its stream to the end, timing every event that carries output."""
    out, ids, last = StreamedTurn(), [], None
    sent = time.perf_counter()
    for arrived, event in post_stream(url + ENDPOINT_PATHS[spec.endpoint], body, spec.timeout):
        text, tokens = event_tokens(event, (out.text, ids or []))
        if event.get("timings"):
            out.timings = event["timings"]
        if event.get("meta_info"):
            out.meta_info = event["meta_info"]
        if (event.get("metrics") or {}).get("speculative_decoding"):
            out.spec_metrics = event["metrics"]["speculative_decoding"]
        choice = (event.get("choices") or [{}])[0]
        out.finish_reason = choice.get("finish_reason") or event.get("stop_type") or finish_type(out.meta_info) \
            or (event.get("details") or {}).get("finish_reason") or out.finish_reason
        if ids is not None:
            ids = None if tokens is None and text else ids + (tokens or [])
        if not text and not tokens:
            continue
        out.text += text
        if last is None:
            out.ttft = arrived - sent
        else:
            out.itl.append(arrived - last)
        last = arrived
    out.e2e = time.perf_counter() - sent
    out.token_ids = ids
    return out


def finish_type(meta_info: dict | None) -> str | None:
    """SGLang's finish reason (a dict with `type`, or a string in older versions), None while it runs."""
    reason = (meta_info or {}).get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason
