"""A fake OpenAI-compatible serving engine for the server backend's tests (bench/measure/serving/): streams token
ids from a deterministic rule (next = (last + 1) % vocab, optionally bent at one position), speaks llama.cpp's
/completion, OpenAI's /v1/completions and /v1/chat/completions, SGLang's native /generate (the output so far in
every event, or increments; speculation in the last event's meta_info under the field names of one SGLang version),
LMDeploy's /generate (increments, told apart from SGLang's by its body) and TGI's /generate_stream, optionally
reports llama.cpp-style per-response timings and speculation counters on /metrics as vLLM, llama.cpp, LMDeploy or
TGI publish them or as MLC-LLM's /debug/dump_engine_metrics, and counts the requests it holds at once.

`python -m tests.fake_server --port N` serves it as a process (the `server.launch` tests)."""
from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCEPT_PATTERN = (2, 0, 1)  # accepted draft tokens of successive speculative steps, cycled
DRAFT_WIDTH = 3  # draft tokens proposed per step


def speculate(n: int, pattern=ACCEPT_PATTERN) -> list[int]:
    """Accepted drafts of each decode step that makes n tokens (the prefill makes the first; a step adds its
    accepted drafts plus one, capped at what is left)."""
    accepts, left = [], n - 1
    while left > 0:
        accepted = min(pattern[len(accepts) % len(pattern)], left - 1)
        accepts.append(accepted)
        left -= accepted + 1
    return accepts


class FakeEngine:
    """The engine's state: its rule, what it reports (`counters`: the /metrics prefix of vLLM-named counters, "tgi"
    for TGI's summary, "mlc" for MLC-LLM's debug endpoint), its counters and the requests it saw."""

    def __init__(self, vocab: int = 300, bend_at: int | None = None, timings: bool = False, counters: str | None = None,
                 hold: int = 0, decode=None, token_ids: bool = True, sglang_fields: str = "2026",
                 incremental: bool = False, request_metrics: bool = False):
        self.vocab, self.bend_at, self.timings, self.prefix = vocab, bend_at, timings, counters
        self.request_metrics = request_metrics  # vLLM's per-request metrics.speculative_decoding in the usage chunk
        self.token_ids, self.sglang_fields, self.incremental = token_ids, sglang_fields, incremental
        self.decode = decode or (lambda ids: "".join(f" t{i}" for i in ids))
        self.barrier = threading.Barrier(hold, timeout=30) if hold > 1 else None
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.bodies: list[dict] = []
        self.drafts = self.draft_tokens = self.accepted = self.steps = 0
        self.per_position: dict[int, int] = {}
        self.lengths: list[int] = []  # accepted drafts of every speculative step so far

    def tokens(self, prompt: list[int], n: int) -> list[int]:
        out, last = [], prompt[-1] if prompt else 0
        for position in range(n):
            last = (last + 1 + (position == self.bend_at)) % self.vocab
            out.append(last)
        return out

    def count(self, n: int) -> dict:
        """Count one response's speculation; its llama.cpp-style timings."""
        accepts = speculate(n)
        with self.lock:
            self.steps += 1 + len(accepts)  # the prefill's step, then the speculative ones
            self.lengths += accepts
            self.drafts += len(accepts)
            self.draft_tokens += DRAFT_WIDTH * len(accepts)
            self.accepted += sum(accepts)
            for k in range(DRAFT_WIDTH):
                self.per_position[k] = self.per_position.get(k, 0) + sum(a > k for a in accepts)
        if not accepts:  # as llama.cpp: no draft fields when nothing was drafted
            return {"predicted_n": n}
        return {"predicted_n": n, "draft_n": DRAFT_WIDTH * len(accepts), "draft_n_accepted": sum(accepts)}

    def metrics_text(self) -> str:
        if self.prefix == "tgi":
            return tgi_metrics_text(self.steps, self.accepted)
        p, labels = self.prefix, 'engine="0",model_name="fake"'
        lines = [f"# TYPE {p}spec_decode_num_drafts_total counter",
                 f"{p}spec_decode_num_drafts_total{{{labels}}} {float(self.drafts)}",
                 f"{p}spec_decode_num_draft_tokens_total{{{labels}}} {float(self.draft_tokens)}",
                 f"{p}spec_decode_num_accepted_tokens_total{{{labels}}} {float(self.accepted)}",
                 "# a comment", "process_cpu_seconds_total 1.5"]
        lines += [f'{p}spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{k}"}} {float(v)}'
                  for k, v in sorted(self.per_position.items()) if v or p != "llamacpp:"]  # llama.cpp: made lazily
        if p == "lmdeploy:":  # prometheus_client's creation times beside its counters
            lines.append(f"{p}spec_decode_num_drafts_created{{{labels}}} 1.7e+09")
        return "\n".join(lines) + "\n"

    def mlc_metrics(self) -> dict:
        """MLC-LLM's engine metrics as POST /debug/dump_engine_metrics answers (FastAPI rendering the EngineMetrics
        object by its attribute): spec_decode only once a speculative step ran, as metrics.cc leaves it out."""
        metrics = {"completion_tokens_sum": self.steps + self.accepted, "decode_tokens_sum": 0}
        if self.lengths:
            draft_count = [len(self.lengths)] * (DRAFT_WIDTH + 1)
            accept_count = [sum(a >= j for a in self.lengths) for j in range(DRAFT_WIDTH + 1)]
            ratios = {f"accept_prob{{step={j}}}": accept_count[j] / draft_count[j] for j in range(DRAFT_WIDTH + 1)}
            metrics["spec_decode"] = {"draft_count": draft_count, "accept_count": accept_count, "accept_prob": ratios}
        return {"metrics": metrics}


class Handler(BaseHTTPRequestHandler):
    engine: FakeEngine  # set on the subclass made per server

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/models"):
            return self.reply(200, "application/json", '{"status": "ok"}')
        if self.path == "/metrics" and self.engine.prefix:
            return self.reply(200, "text/plain", self.engine.metrics_text())
        self.reply(404, "text/plain", "not found")

    def reply(self, status: int, kind: str, body: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine = self.engine
        if self.path == "/debug/dump_engine_metrics":
            if engine.prefix != "mlc":
                return self.reply(404, "application/json", '{"detail": "Not Found"}')
            return self.reply(200, "application/json", json.dumps(engine.mlc_metrics()))
        with engine.lock:
            engine.bodies.append({"path": self.path, **body})
            engine.in_flight += 1
            engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
        try:
            if engine.barrier is not None:
                engine.barrier.wait()
            self.stream(body)
        finally:
            with engine.lock:
                engine.in_flight -= 1

    def stream(self, body: dict) -> None:
        if self.path == "/generate":
            return self.stream_sglang(body) if "sampling_params" in body else self.stream_lmdeploy(body)
        if self.path == "/generate_stream":
            return self.stream_tgi(body)
        engine, native = self.engine, self.path == "/completion"
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            prompt = [len(str(prompt if prompt is not None else body["messages"][-1]["content"])) % engine.vocab]
        ids = engine.tokens(prompt, body["n_predict"] if native else body["max_tokens"])
        timings = engine.count(len(ids))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in ids:
            text = engine.decode([token])
            if native:
                event = {"content": text, "tokens": [token], "stop": False}
            else:
                choice = {"index": 0, "finish_reason": None}
                choice.update({"delta": {"content": text}} if "messages" in body else {"text": text})
                if engine.token_ids and body.get("return_token_ids"):
                    choice["token_ids"] = [token]
                event = {"choices": [choice]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        last = {"content": "", "tokens": [], "stop": True, "stop_type": "limit"} if native else \
            {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        if engine.timings:
            last["timings"] = timings
        self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
        if engine.request_metrics and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"choices": [], "usage": {"completion_tokens": len(ids)},
                     "metrics": {"speculative_decoding": vllm_request_metrics(len(ids))}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"" if native else b"data: [DONE]\n\n")


    def stream_sglang(self, body: dict) -> None:
        """SGLang's /generate: `text` and `output_ids` so far (or increments), meta_info's speculation at the end."""
        engine = self.engine
        ids = engine.tokens(body["input_ids"], body["sampling_params"]["max_new_tokens"])
        engine.count(len(ids))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for k in range(1, len(ids) + 1):
            meta = {"completion_tokens": k, "finish_reason": None if k < len(ids) else {"type": "length"}}
            if k == len(ids):
                meta.update(sglang_spec_meta(len(ids), engine.sglang_fields))
            shown = ids[k - 1:k] if engine.incremental else ids[:k]
            event = {"text": engine.decode(shown), "output_ids": shown, "meta_info": meta}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


    def stream_lmdeploy(self, body: dict) -> None:
        """LMDeploy's /generate: each event the new `text` and `output_ids`, meta_info's completion_tokens so far;
        a last event without output carrying the finish reason."""
        engine = self.engine
        ids = engine.tokens(body["input_ids"], body["max_tokens"])
        engine.count(len(ids))
        self.start_events()
        for k, token in enumerate(ids, start=1):
            meta = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": k, "finish_reason": None}
            self.send_event({"text": engine.decode([token]), "output_ids": [token], "meta_info": meta})
        meta = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids),
                "finish_reason": {"type": "length"}}
        self.send_event({"text": "", "output_ids": [], "meta_info": meta})
        self.wfile.write(b"data: [DONE]\n\n")

    def stream_tgi(self, body: dict) -> None:
        """TGI's /generate_stream: one event per token (`token`: id, text, logprob, special), the last one with
        generated_text and details; no [DONE]. The prompt is text, so the rule starts from its length."""
        engine, parameters = self.engine, body["parameters"]
        ids = engine.tokens([len(body["inputs"]) % engine.vocab], parameters["max_new_tokens"])
        engine.count(len(ids))
        self.start_events()
        for index, token in enumerate(ids, start=1):
            event = {"index": index, "token": {"id": token, "text": engine.decode([token]), "logprob": -0.5,
                                               "special": False}, "generated_text": None, "details": None}
            if index == len(ids):
                event["generated_text"] = engine.decode(ids)
                event["details"] = {"finish_reason": "length", "generated_tokens": len(ids), "seed": None,
                                    "input_length": 7}
            self.send_event(event)

    def start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def send_event(self, event: dict) -> None:
        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.flush()


def vllm_request_metrics(n: int) -> dict:
    """vLLM's per-request metrics.speculative_decoding (--per-request-spec-decode-metrics detailed) for a turn of n
    tokens: as vLLM, the last step's accepted drafts are counted before max_tokens cuts them (ACCEPT_PATTERN's value,
    not speculate's capped one)."""
    accepts = speculate(n)
    if accepts:
        accepts[-1] = ACCEPT_PATTERN[(len(accepts) - 1) % len(ACCEPT_PATTERN)]
    histogram = [sum(a == j for a in accepts) for j in range(DRAFT_WIDTH + 1)]
    return {"mean_acceptance_length": 1 + sum(accepts) / max(1, len(accepts)), "acceptance_histogram": histogram,
            "num_spec_steps": len(accepts), "num_accepted_draft_tokens": sum(accepts),
            "num_draft_tokens": DRAFT_WIDTH * len(accepts), "num_spec_tokens": DRAFT_WIDTH,
            "per_step_accepted": accepts, "per_step_drafted": [DRAFT_WIDTH] * len(accepts)}


def tgi_metrics_text(steps: int, skipped: int) -> str:
    """TGI's /metrics around its skipped-tokens summary (metrics-exporter-prometheus: quantiles over a window, _sum and
    _count since start)."""
    name = "tgi_request_skipped_tokens"
    return "\n".join(["# TYPE tgi_request_count counter", "tgi_request_count 4",
                      f"# HELP {name} Speculated tokens per request", f"# TYPE {name} summary",
                      f'{name}{{quantile="0"}} 0', f'{name}{{quantile="0.5"}} 1', f'{name}{{quantile="1"}} 2',
                      f"{name}_sum {skipped}", f"{name}_count {steps}", "tgi_request_generated_tokens_sum 99",
                      "tgi_request_generated_tokens_count 9"]) + "\n"


def sglang_spec_meta(n: int, fields: str) -> dict:
    """meta_info's speculation fields for n tokens, named as SGLang `fields` names them: "2026" (accepted / proposed
    drafts and the acceptance histogram), "2025" (accept / draft token nums), "verify" (spec_verify_ct only)."""
    accepts = speculate(n)
    meta = {"spec_verify_ct": len(accepts)}
    if fields == "2026":
        histogram = [sum(a == k for a in accepts) for k in range(DRAFT_WIDTH + 1)]
        meta.update(spec_accepted_drafts=sum(accepts), spec_proposed_drafts=DRAFT_WIDTH * len(accepts),
                    spec_accept_histogram=histogram)
    elif fields == "2025":
        meta.update(spec_accept_token_num=sum(accepts), spec_draft_token_num=DRAFT_WIDTH * len(accepts))
    return meta


class FakeServer:
    """`with FakeServer(FakeEngine(...)) as server:` serves the engine on 127.0.0.1 (server.url) in a thread."""

    def __init__(self, engine: FakeEngine, port: int = 0):
        handler = type("BoundHandler", (Handler,), {"engine": engine})
        self.engine, self.httpd = engine, ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "FakeServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timings", action="store_true")
    args = parser.parse_args()
    server = FakeServer(FakeEngine(timings=args.timings), args.port)
    print(f"fake server listening on {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
