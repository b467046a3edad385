"""One parity file per method, found by scanning this folder (its name is the method's): a docstring whose first
line says what it is compared with, `AGAINST` (the reference implementation, in a few words) and
`comparisons(setup, work) -> list[Comparison]` (bench/parity/protocol.py), its knobs composed from conf/."""
