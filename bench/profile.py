"""`python -m bench.profile model=<m> [...]`: measure the target's forward times (bench/planning/profile.py)."""
from bench.planning.profile import main

if __name__ == "__main__":
    main()
