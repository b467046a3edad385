"""The reference-code sides of the parity checks: drivers run by path in side environments (`<python>
bench/parity/sides/<driver>.py JOB.json OUT.json`), importing nothing of the project (tests/test_layers.py), and
importing each other by module name (their folder is the script's path entry)."""
