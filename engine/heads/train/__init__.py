"""Self-distillation for a draft head: the target answers prompts from a built-in generator, its hidden states
over prompt and answer are extracted once, and the head learns to predict the next hidden state (and through
the target's LM head, the next token) from the current one and the next token.

- `prompts.py`: the prompts (topics x task forms, arithmetic, code, translation, questions, long texts, the
  questions the model writes itself, second turns)
- `answers.py`: an answer, and the data folder's file of them; `distill.py`: the target answering the prompts
- `features.py`: the target's features over each conversation, stored and read back memory-mapped
- `frozen.py`: the target's embedding, final norm and LM head that training reads; `losses.py`: each kind's loss
- `fit.py`: fitting a head, with checkpoints to resume from; `evaluate.py`: its held-out acceptance
- `run.py`: a whole run from options to a saved head (`run_training`), as `specula train-head` and the app run it
"""

from .answers import Answer, held_out_first_turns, read_answers
from .distill import ANSWER_ROWS, SAMPLED_SHARE, SAMPLING, self_distill
from .evaluate import chain_acceptance, medusa_acceptance, unrolled_acceptance
from .features import EAGLE3_CONTEXT, TARGET_TOP, Sequence, features_of, with_features
from .fit import frequent_tokens, start_head, train_head
from .prompts import (
    DOCUMENT_SHARE,
    MODEL_QUERY,
    MODEL_QUERY_SHARE,
    QUERY_SAMPLING,
    prompt_conversations,
    query_prefix,
    usable_query,
)
from .run import (
    HEAD_KINDS,
    TrainOptions,
    TrainResult,
    check_options,
    default_out,
    head_info,
    progress_line,
    run_training,
)

__all__ = [
    "ANSWER_ROWS", "Answer", "DOCUMENT_SHARE", "EAGLE3_CONTEXT", "HEAD_KINDS", "MODEL_QUERY", "MODEL_QUERY_SHARE",
    "QUERY_SAMPLING", "SAMPLED_SHARE", "SAMPLING", "Sequence", "TARGET_TOP", "TrainOptions", "TrainResult",
    "chain_acceptance", "check_options", "default_out", "features_of", "frequent_tokens", "head_info",
    "held_out_first_turns", "medusa_acceptance", "prompt_conversations", "progress_line", "query_prefix",
    "read_answers", "run_training", "self_distill", "start_head", "train_head", "unrolled_acceptance",
    "usable_query", "with_features",
]
