"""The backends of the measurement protocol (bench/measure/protocol.py): what answers a run's questions, on the
method's side and on the baseline's. engine.py: our engine; server.py: a serving engine over HTTP."""
