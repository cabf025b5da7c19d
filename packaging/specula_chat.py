"""The bundle's entry script: `app.main:main`, exactly what the `specula-chat` command runs."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
