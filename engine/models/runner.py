"""Specula's own forward, for every family with a spec (families/), over a KV cache (cache.py) it grows and rolls back.

It runs the products of `layers.py` (the model's weights, shared by every runner of the model) and replaces what
costs on the hot path: attention reads a preallocated cache (attention.py's plans), rollback is moving `length`, and
no mask is built for single-token steps. A pass is the eager forward (eager.py), the compiled step (compiled.py) or a
GPU's static step (static.py), chosen here when an answer starts. `shallow(n)` gives a runner over the first n layers
with its own cache, sharing the products (early-exit self-speculation).
"""

from __future__ import annotations

import torch

from ..cpu.step import StepMode
from ..decoding.tree import TokenTree
from .attention import Heads, cap
from .cache import Cache, Shape
from .compiled import StepHandle, forward_compiled, prompt_through_step, step_for
from .eager import forward_eager
from .families import spec_for
from .gguf import NativeWeights, out_features, weight_device, weight_dtype
from .layers import Multiplied, context_window, fused_layers, norm_of, rotary_tables
from .static import FLOOR, StepGraphs, bucket, forward_static, start_graphs, static_context
from .vocab import VocabCut


class LeanRunner:
    """Specula's own forward over a KV cache (cache.py), for every family with a spec (families/): the eager pass
    (eager.py), the compiled step's (compiled.py) or a GPU's static steps (static.py), chosen per answer."""

    keeps_features = True  # features(): the last layer's hidden states of the positions held

    def __init__(self, model: torch.nn.Module, n_layers: int | None = None, native: NativeWeights | None = None,
                 step: StepMode = StepMode.EAGER, static: bool = False, graphs: bool = False,
                 floor: int = FLOOR) -> None:
        cfg = model.config
        self.model = model
        self.native = native
        # EAGER, or AUTO/COMPILED: the compiled step where it applies and is loaded, chosen at each prefill (one mode
        self.step = step  # for a whole answer)
        self.fast: StepHandle | None = None  # the compiled step the current answer runs (None: another step)
        self.spec = spec = spec_for(model)
        layers, self.lm_head = fused_layers(model, native)
        self.layers = layers[: n_layers or cfg.num_hidden_layers]
        # Gemma 2's soft-capping of attention scores (0: none); the embeddings multiplied where the spec says (Granite)
        self.softcap = spec.attention_softcap
        self.embed = model.model.embed_tokens
        if spec.embedding_multiplier != 1.0:
            self.embed = Multiplied(self.embed, spec.embedding_multiplier)
        self.norm = norm_of(model.model.norm, spec)
        self.vocab_size = out_features(model.lm_head)
        self.vocab = VocabCut(self.vocab_size)  # logits over the first ids only (limit_vocab): a draft model's cut
        # static (a GPU's step): the cache allocated once for `max_len` positions and every step after the prefill in a
        # bucket of fixed shape, at least `floor` rows; with `graphs`, captured as CUDA graphs in the background
        self.static = static
        self.floor = floor
        self.max_len = static_context(context_window(cfg)) if static else context_window(cfg)
        self.device = weight_device(model.lm_head)
        self.dtype = weight_dtype(model.lm_head)
        self.n_heads, self.n_kv, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.groups = self.n_heads // self.n_kv
        self.scale = spec.attention_scale
        self.heads = Heads(self.n_heads, self.n_kv, self.head_dim, self.scale, self.softcap, self.dtype)
        # On the CPU, attention after the prefill runs in fp32 over an fp32 cache in key blocks (see
        # attention.py's plans): faster than bf16 attention there, and every position rounds the same way
        # whatever else the pass holds. Other devices use the fused kernel in the model's dtype.
        self.blocked = self.device.type == "cpu" and not static
        # Consistent rounding (CPU): a position meets the same kernels decoded alone or in a verify pass (a product
        # whose one-row kernel rounds otherwise runs a single step on two identical rows: `stable_rows`, in_rows),
        # so with the blocked attention speculation reproduces plain decoding bit for bit. False: one-row kernels.
        self.consistent = self.blocked
        self.windows = sorted({layer.window for layer in self.layers})  # 0: full attention
        # the positions held (the compiled step's single steps read a bf16 model's values from a bf16 copy)
        self.cache = Cache(Shape(len(self.layers), self.n_kv, self.head_dim, spec.hidden, self.dtype,
                                 torch.float32 if self.blocked else self.dtype, self.device, self.max_len,
                                 context_window(cfg), static, self.dtype == torch.bfloat16),
                           rotary_tables(model, spec))  # a table per kind of layer with its own (layers.rope_kinds)
        self.graphs: StepGraphs | None = start_graphs(self, floor) if static and graphs else None

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 logits divided by the model's logits scaling (Granite's), or soft-capped (Gemma 2's); most: as they are."""
        if self.spec.logit_divisor != 1.0:
            logits = logits / self.spec.logit_divisor
        return cap(logits, self.spec.final_softcap) if self.spec.final_softcap else logits

    @property
    def exact_trees(self) -> bool:
        """Whether a token tree's pass decides as a chain pass would. On a CPU it does while the current answer
        runs through the compiled step: every product gives a row its own bits, and a tree row's attention
        takes its keys in the chain's order (docs/ENGINE.md, "Attention"; tested against single steps). The
        eager forward's does not, in bf16 or fp32: a node's keys sit among its siblings', its attention sums
        run in another order and a near tie can tip (seen in fp32 on a tiny model: a margin of 5 ulps between
        the two best logits); nor do static steps' (a GPU's). There tree drafters send their best chain."""
        if self.static:
            return False
        return not self.blocked or self.fast is not None

    def shallow(self, n_layers: int) -> "LeanRunner":
        return LeanRunner(self.model, n_layers, self.native, self.step, self.static, self.graphs is not None,
                           self.floor)

    @property
    def compiled(self) -> bool:
        """Whether the current answer runs through the compiled step."""
        return self.fast is not None

    @property
    def own_products(self) -> bool:
        """Whether the current answer's step runs the own products (over the file's blocks or bf16 weights)."""
        return self.fast is not None and (self.fast.lm_head is not None or bool({"blocks", "tiles", "tiles-plain", "tiles-unpack"} & set(self.fast.kinds)))

    @property
    def step_kind(self) -> str:
        """The step the current answer runs (chosen when it starts): "compiled", "static" or "eager"; plain
        steps' times are comparable within one kind only (the live speedup's samples)."""
        return "compiled" if self.fast is not None else "static" if self.static else "eager"

    length = property(lambda self: self.cache.length)
    aux_layers = property(lambda self: self.cache.aux_layers)

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def reusable(self, ids: torch.Tensor) -> int:
        """How many leading positions of the prompt `ids` (T,) the cache already holds as reading it anew would
        write them: the tokens it shares with what the cache holds, short of the prompt's last (read for its
        logits). Only where every position's bits are those of single steps whatever pass wrote them (the
        compiled step, prompts through it too: `prompt_through_step`); elsewhere 0."""
        held = min(self.cache.length, ids.shape[0] - 1)
        fast = self.fast
        if held <= 0 or fast is None or self.static or fast is not step_for(self) or not prompt_through_step(fast, self.dtype):
            return 0
        differ = torch.nonzero(self.cache.ids[:held] != ids[:held].cpu())
        return int(differ[0, 0]) if differ.numel() else held

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last: int = 1, tree: TokenTree | None = None) -> torch.Tensor:
        """tokens (T,) -> fp32 logits (last, V). With a `tree` the tokens are its rows: row 0 continues the
        cache, every other row its parent row; each row sees the cache and its own ancestors, at the
        position of its depth. Afterwards `keep()` keeps one root-to-node path."""
        if self.graphs is not None:
            with self.graphs.recording:  # not while a graph is being recorded (a moment, once per bucket)
                return self.vocab.logits(self._forward(tokens, last, tree))
        return self.vocab.logits(self._forward(tokens, last, tree))

    def _forward(self, tokens: torch.Tensor, last: int, tree: TokenTree | None) -> torch.Tensor:
        t = tokens.shape[0]
        cache = self.cache
        start = cache.length
        end = start + t
        cache.begin(start, tokens)
        if start == 0:  # a new answer: it runs in one mode throughout
            self.fast = step_for(self)
        if tree is not None and (start == 0 or len(tree) != t):
            raise ValueError("a tree continues a non-empty cache, one row per token")
        if self.fast is not None and (start > 0 or t == 1 or prompt_through_step(self.fast, self.dtype)):
            return forward_compiled(self, tokens, last, tree, start)
        rows = bucket(t, self.floor) if self.static and start > 0 else None
        if rows is not None:
            return forward_static(self, tokens, last, tree, start, rows)
        return forward_eager(self, tokens, last, tree, start)

    def limit_vocab(self, n: int) -> None:
        """Logits over the ids below n only (0: all of them): a draft model's cut vocabulary (vocab.py)."""
        self.vocab.limit(n)

    @property
    def head_rows(self) -> int:
        return self.vocab.rows

    def head_product(self, product):
        """The LM head product a pass runs (a file's blocks cut to the vocabulary's first ids: vocab.py)."""
        return self.vocab.product(product)

    def keep_layers(self, layers: tuple[int, ...]) -> None:
        """From the next prompt on, keep the hidden states entering these layers for every position
        (`aux_features`); () keeps none."""
        layers = tuple(sorted(set(int(i) for i in layers)))
        if any(not 0 <= i < len(self.layers) for i in layers):
            raise ValueError(f"layers {layers} are not all among the model's {len(self.layers)}")
        if self.cache.keep_layers(layers) and self.graphs is not None:  # the captured steps wrote the old buffer
            self.graphs.start()

    def aux_features(self, start: int, end: int) -> torch.Tensor:
        return self.cache.aux_features(start, end)  # the kept layers' states of positions start..end-1

    def features(self, start: int, end: int) -> torch.Tensor:
        return self.cache.features(start, end)  # the last layer's states (before the final norm) of start..end-1

    @torch.inference_mode()
    def keep(self, start: int, rows: list[int]) -> None:
        self.cache.keep(start, rows)  # after a tree pass from `start`: the path `rows` kept, the rest dropped
