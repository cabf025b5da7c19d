"""How long the second turn of a conversation waits for its first token: the cache kept from the first turn
against the whole conversation read again (Session.forget), alternating, on the bundled model.

usage: python second_turn.py [REPEATS]
"""

import statistics
import sys

from specula.engine.api.events import Finished
from specula.engine.api.prompts import conversation
from specula.engine.api.types import DecodeConfig, GenerateRequest, LoadRequest, Message, ModelSpec
from specula.engine.serving.session import Session

FIRST = ("Here is a passage from Python's documentation:\n\n" + __import__("json").__doc__ +
         "\n\nSummarize what this module does in three sentences.")
SECOND = "Now give one example of using it."


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    session = Session()
    session.load(LoadRequest(ModelSpec("bundled", "cpu", "bf16", step="compiled"), measure_baseline=False))
    config = DecodeConfig(k=4, max_new_tokens=96)
    waits = {"kept": [], "read again": []}
    for i in range(repeats):
        for how in (("kept", "read again") if i % 2 == 0 else ("read again", "kept")):
            session.forget()
            first = [e for e in session.generate(GenerateRequest(conversation(FIRST), "none", config)) if isinstance(e, Finished)][0]
            history = conversation(FIRST) + (Message("assistant", first.text),)
            if how == "read again":
                session.forget()
            second = GenerateRequest(conversation(SECOND, None, history), "none", config)
            done = [e for e in session.generate(second) if isinstance(e, Finished)][0]
            waits[how].append(done.totals.prefill_s)
    prompt = len(session.encode(second))
    for how, values in waits.items():
        print(f"{how}: first token after {1000 * statistics.median(values):.1f} ms (median of {len(values)}; "
              f"a second-turn prompt of {prompt} tokens)")


if __name__ == "__main__":
    main()
