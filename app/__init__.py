"""Specula's desktop app (PySide6 + pyqtgraph).

Its engine runs in a process of its own (`specula serve`, started and owned by `bridge.EngineBridge`);
the app talks to it only through `specula.engine.remote.client` and reads the frozen events of
`specula.engine.api.events`. The app's process never imports torch: it imports the engine's `api` (the
contract) and `remote` (the client, servers, the Hub) only, both plain Python (tests/test_layout.py).
The window paints first; the engine starts beside it.

    main.py        `specula-chat`: command line;  autopilot.py  --send / --screenshot / --exit-after-reply
    window.py      the main window: layout, menus, status bar, event routing, message actions
    layout.py      the remembered window layout (QSettings)
    bridge.py      the engine process and its client behind a Qt signal (events arrive on the GUI thread)
    chat.py        conversations and replies: history <-> transcript <-> requests; regenerate, edit
    fit.py         leaving out the oldest turns when a prompt outgrows the context window
    compare.py     re-run the last prompt with `none` and the strategy;  comparecard.py  its card
    chatview.py    the transcript: tokens coloured by origin, ghost drafts, hover details, action links
    bubbles.py     drawing bubbles, tokens, summaries and action rows;  markdown.py  rendered answers
    actions.py     which links (Edit, Copy, Markdown, Regenerate, Retry) a message gets
    tokens.py      events -> token records, tooltips, the summary line;  theme.py  the colours
    plots.py       live acceptance, tokens/s vs the measured baseline, speedup, histograms
    controls.py    strategy, k, adaptive k, temperature, max new tokens (the toolbar)
    composer.py, sidebar.py, legend.py, notice.py, settings_dialog.py   the smaller widgets
    settings.py    the versioned settings file;  history.py  conversations, turns, their JSON and Markdown
    history_db.py  conversations in SQLite: appended saves, interrupted answers, search, the JSON import
    storage.py     atomic JSON writes and setting corrupt files aside
    background.py  slow work on a worker thread, its result and progress delivered on the GUI thread
    folders.py     where the file dialogs open (the last folder chosen, else Downloads or Documents)
"""
