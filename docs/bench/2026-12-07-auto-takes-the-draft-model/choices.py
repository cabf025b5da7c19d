"""Run a specula command with auto's choices logged, one JSON line per step, to the file named first:
    python choices.py LOG bench ...
(its options, how many drafting steps each has measured, each warm option's rate in tokens per plain step, and the
choice with its length; and whether the draft model waits for a read)."""
import sys, json
import specula.engine.drafters.auto as A
log = open(sys.argv[1], "w")
orig = A.Auto._pick
def pick(self, options, plain_s):
    out = orig(self, options, plain_s)
    models = {o: self._model(o) for o in options}
    log.write(json.dumps({"step": self.steps, "options": options, "warm": {o: models[o].drafting_steps for o in options},
                          "rates": {o: round(models[o].best(plain_s, least=1)[1] * (plain_s or 1), 3) for o in options if models[o].warm},
                          "chose": out}) + "\n")
    return out
A.Auto._pick = pick
orig_prop = A.Auto.propose
def propose(self, ctx, k):
    dm = self.heads.get("draft-model")
    if dm is not None:
        log.write(json.dumps({"step": self.steps + 1, "dm_waiting": dm[0].waiting(ctx), "len": ctx.tokens.shape[0]}) + "\n")
    return orig_prop(self, ctx, k)
A.Auto.propose = propose
from specula.engine.cli.main import main
sys.exit(main(sys.argv[2:]))
