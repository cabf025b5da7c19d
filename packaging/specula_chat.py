"""The bundle's entry script: `specula.app.main:main`, exactly what the `specula-chat` command runs. The app
starts its engine process with this same executable: `--engine ARGS` runs the `specula` command line."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        from specula.engine.cli.main import main as engine_main

        sys.exit(engine_main(sys.argv[2:]))
    from specula.app.main import main

    sys.exit(main())
