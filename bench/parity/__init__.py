"""Parity with the reference implementations: `python -m bench.parity` runs each method's parity file
(bench/parity/methods/<method>.py) through one protocol (protocol.py) beside the reference code, which runs in side
environments (environments.py, sides/); `python -m bench.parity.engines` runs one head in our engine and in vLLM."""
