"""The `specula` command: `main.py` parses, one module per subcommand runs it (`generate`, `chat`,
`serve`, `export`, `train`, and the bench in `bench/`), `common.py` holds what they share."""
