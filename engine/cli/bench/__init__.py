"""`specula bench`: `command.py` reads the flags, `run.py` measures (strategies and peers interleaved on
the same prompts), `report.py` summarises, `charts.py` draws."""
