"""`python -m bench.regress results/ --baseline <file>`: the regression gate (bench/report/regress.py)."""
from bench.report.regress import main

if __name__ == "__main__":
    main()
