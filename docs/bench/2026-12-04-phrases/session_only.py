"""`specula bench` with no phrase table found for the model: auto's phrases come only from the answers the
process has decoded so far (the session), as for a model without a shipped table."""
import sys

from specula.engine.cli.main import main
from specula.engine.drafters import phrases

phrases.phrase_folders = lambda: []
sys.exit(main(sys.argv[1:]))
