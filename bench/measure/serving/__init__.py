"""`backend=server`: the tasks, records and reports of our engine's runs, against an OpenAI-compatible serving
engine (llama.cpp, vLLM, SGLang...) that the harness talks to over HTTP (docs/serving.md)."""
