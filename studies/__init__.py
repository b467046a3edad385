"""One-off measurements that feed a doc (studies/README.md): each imports the project, nothing imports them
(tests/test_layers.py)."""
