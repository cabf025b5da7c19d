"""`python -m specula.engine.cli ARGS`: the `specula` command line (the window starts its engine so)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
