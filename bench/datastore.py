"""`python -m bench.datastore [datastore.<key>=...]`: build REST's datastore (methods/rest_datastore.py)."""
from methods.rest_datastore import main

if __name__ == "__main__":
    main()
