"""Specula's desktop app (PySide6 + pyqtgraph). It talks to the engine only through
`engine.runner.Runner` and the events in `engine.events`; until the window lands, `make run` opens the
terminal chat (`specula chat`)."""
