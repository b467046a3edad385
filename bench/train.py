"""`python -m bench.train method=<m> [train.<key>=...]`: train a method's draft weights (methods/train.py)."""
from methods.train import main

if __name__ == "__main__":
    main()
