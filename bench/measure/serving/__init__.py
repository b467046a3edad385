"""Talking to an OpenAI-compatible serving engine (llama.cpp, vLLM, SGLang...) over HTTP, for `backend=server`
(bench/measure/backends/server.py, docs/serving.md): an endpoint answering questions, streamed requests, launched
servers, acceptance counters, the serving columns."""
