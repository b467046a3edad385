"""`python -m bench.report [results/] [--out reports/]`: the leaderboard and its plots (bench/report/render.py)."""
from bench.report.render import main

if __name__ == "__main__":
    main()
