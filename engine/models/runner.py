"""Specula's own forward, for every family with a spec (families/), over a KV cache it grows and rolls back.

It runs the products of `layers.py` (the model's weights, shared by every runner of the model) and replaces what
costs on the hot path: attention reads a preallocated cache (attention.py's plans), rollback is moving `length`, and
no mask is built for single-token steps. A pass runs the eager forward here, the compiled step (compiled.py) or a
GPU's static step (static.py), chosen when an answer starts. `shallow(n)` gives a runner over the first n layers with
its own cache, sharing the products (early-exit self-speculation).
"""

from __future__ import annotations

import torch

from ..api.errors import ContextTooLongError
from ..cpu.products import TILE_COLS, Blocks, in_rows
from ..cpu.step import StepMode
from ..decoding.tree import TokenTree
from .block import call, layer_pass, rms_norm
from .attention import Heads, Plan, cap, pass_plan, tree_plan, whole_blocks
from .compiled import StepHandle, forward_compiled, prompt_through_step, step_for
from .families import head_dim, spec_of
from .gguf import NativeWeights, out_features, weight_device, weight_dtype
from .layers import LayerWeights, context_window, fused_layers, norm_of, rotary_tables
from . import static as static_steps
from .static import BUCKETS, FLOOR, StepGraphs, StepInputs, bucket, forward_static, static_context, step_inputs

_GROW = 256  # cache capacity grows in steps of this many positions


class _Multiplied(torch.nn.Module):
    """An embedding whose rows are multiplied by a number, in the model's dtype (Granite's embedding multiplier)."""

    def __init__(self, embed: torch.nn.Module, multiplier: float) -> None:
        super().__init__()
        self.embed, self.multiplier = embed, multiplier

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.multiplier


class LeanRunner:
    """Specula's own forward over a KV cache, for every family with a spec (families/): the eager forward here,
    the compiled step's passes (compiled.py) and a GPU's static steps (static.py), chosen per answer."""

    keeps_features = True  # features(): the last layer's hidden states of the positions held

    def __init__(self, model: torch.nn.Module, n_layers: int | None = None, native: NativeWeights | None = None,
                 step: StepMode = StepMode.EAGER, static: bool = False, graphs: bool = False,
                 floor: int = FLOOR) -> None:
        cfg = model.config
        self.model = model
        self.native = native
        # EAGER, or AUTO/COMPILED: the compiled step (cpu/step.py) where it applies and is
        # loaded, chosen at each prefill, so one answer runs in one mode from its first token to its last
        self.step = step
        self._fast: StepHandle | None = None
        self.spec = spec = spec_of(cfg)
        layers, self.lm_head = fused_layers(model, native)
        self.layers = layers[: n_layers or cfg.num_hidden_layers]
        # Gemma 2's soft-capping of attention scores (0: none); the embeddings multiplied where the spec says (Granite)
        self.softcap = spec.attention_softcap
        self.embed = model.model.embed_tokens
        if spec.embedding_multiplier != 1.0:
            self.embed = _Multiplied(self.embed, spec.embedding_multiplier)
        self.norm = norm_of(model.model.norm, spec)
        self.vocab_size = out_features(model.lm_head)
        # logits over the first `head_rows` ids only (0: all; limit_vocab): a draft model's cut vocabulary
        self.head_rows = 0
        self._cut_head: tuple | None = None  # (the file's LM head blocks, their first head_rows outputs)
        # static (models/static.py, a GPU's step): the cache is allocated once for `max_len` positions (and a
        # scratch slot) and every step after the prefill runs in a bucket of fixed shape, at least `floor`
        # rows; with `graphs`, the buckets are captured as CUDA graphs in the background
        self.static = static
        self.floor = floor
        self.max_len = static_context(context_window(cfg)) if static else context_window(cfg)
        self.device = weight_device(model.lm_head)
        self.dtype = weight_dtype(model.lm_head)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = head_dim(cfg)
        self.groups = self.n_heads // self.n_kv
        self.scale = spec.attention_scale
        self.heads = Heads(self.n_heads, self.n_kv, self.head_dim, self.scale, self.softcap, self.dtype)
        # one rotary table per kind of layer that has its own (layers.rope_kinds): (inverse frequencies, scaling)
        self._rotary = rotary_tables(model, spec)
        self.rotary_dims = 2 * self._rotary[0].inv_freq.shape[0]  # the dimensions of a head that rotate (all, or a part)
        self._windows = sorted({layer.window for layer in self.layers})  # 0: full attention
        self._cos = self._sin = torch.empty(0)  # (tables, capacity, head_dim)
        self._k = self._v = torch.empty(0)  # (layers, n_kv, capacity, head_dim)
        # the compiled step's keys, transposed in blocks of 16 (layers, n_kv, capacity / 16, head_dim, 16),
        # in step with _k for the first _kt_len slots
        self._kt = torch.empty(0)
        self._kt_len = 0
        self._length = 0
        self._ids = torch.empty(0, dtype=torch.long)  # the token of each position the cache holds (host memory)
        # On the CPU, attention after the prefill runs in fp32 over an fp32 cache in key blocks (see
        # _attend_blocked): faster than bf16 attention there, and every position rounds the same way
        # whatever else the pass holds. Other devices use the fused kernel in the model's dtype.
        self.blocked = self.device.type == "cpu" and not static
        self.cache_dtype = torch.float32 if self.blocked else self.dtype
        # A bf16 model's values are bf16 numbers: the compiled step keeps a bf16 copy of them (_vn, in step with
        # _v where _kt is) for single steps, which read the whole cache each (a quarter fewer bytes, the same sums)
        self.narrow_values = self.dtype == torch.bfloat16
        self._vn = torch.empty(0)
        # Consistent rounding (CPU): every position meets the same kernels whether it is decoded alone or
        # inside a verify pass; with the blocked attention, speculation then reproduces plain decoding bit
        # for bit in bf16 too. Where a product's one-row kernel rounds differently from its multi-row one
        # (F.linear; oneDNN's longer sums), a single step runs that product on two identical rows
        # (`stable_rows`, measured at load, quant.in_rows); the others give one row the bits it gets
        # among others. False gives the one-row kernels.
        self.consistent = self.blocked
        # the final hidden state (before the final norm) of every cached position, kept and rolled back
        # with the cache: the features that feature-level drafters (EAGLE, Medusa) read
        self._feat = torch.empty(0)
        # the hidden states entering these layers, kept per position beside the cache (EAGLE-3 heads read a
        # low, a middle and a high one; `keep_layers`): (capacity, len(aux_layers), D)
        self.aux_layers: tuple[int, ...] = ()
        self._aux = torch.empty(0)
        self.graphs: StepGraphs | None = None
        if static:
            self._reserve(self.max_len)
            if graphs:
                self.graphs = StepGraphs(lambda inp: static_steps.static_step(self, inp), self._idle_inputs, self._buffers,
                                         tuple(b for b in BUCKETS if b >= floor) or BUCKETS[-1:], self.device)
                self.graphs.start()

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
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
        return not self.blocked or self._fast is not None

    def shallow(self, n_layers: int) -> "LeanRunner":
        return LeanRunner(self.model, n_layers, self.native, self.step, self.static, self.graphs is not None,
                           self.floor)

    @property
    def compiled(self) -> bool:
        """Whether the current answer runs through the compiled step."""
        return self._fast is not None

    @property
    def own_products(self) -> bool:
        """Whether the current answer's step runs the own products (over the file's blocks or bf16 weights)."""
        return self._fast is not None and (self._fast.lm_head is not None or bool({"blocks", "tiles", "tiles-plain", "tiles-unpack"} & set(self._fast.kinds)))

    @property
    def step_kind(self) -> str:
        """The step the current answer runs (chosen when it starts): "compiled", "static" or "eager"; plain
        steps' times are comparable within one kind only (the live speedup's samples)."""
        return "compiled" if self._fast is not None else "static" if self.static else "eager"

    @property
    def length(self) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        self._length = min(self._length, max(0, length))
        self._kt_len = min(self._kt_len, self._length)

    def reusable(self, ids: torch.Tensor) -> int:
        """How many leading positions of the prompt `ids` (T,) the cache already holds as reading it anew would
        write them: the tokens it shares with what the cache holds, short of the prompt's last (read for its
        logits). Only where every position's bits are those of single steps whatever pass wrote them (the
        compiled step, prompts through it too: `prompt_through_step`); elsewhere 0."""
        held = min(self._length, ids.shape[0] - 1)
        fast = self._fast
        if held <= 0 or fast is None or self.static or fast is not step_for(self) or not prompt_through_step(fast, self.dtype):
            return 0
        differ = torch.nonzero(self._ids[:held] != ids[:held].cpu())
        return int(differ[0, 0]) if differ.numel() else held

    def _reserve(self, needed: int) -> None:
        if needed > self.max_len:
            window = context_window(self.model.config)
            held = ("the model's window" if self.max_len == window else
                    f"the {window}-token window's first positions, which a static cache holds (SPECULA_CONTEXT)")
            raise ContextTooLongError(f"context of {needed} tokens exceeds {held}: {self.max_len}")
        capacity = self._k.shape[2] if self._k.ndim == 4 else 0
        if needed <= capacity:
            return
        if self.static:  # once, for good: the whole context and the scratch slot
            new_cap = self.max_len + 1
        else:
            new_cap = min(self.max_len, max(needed, 2 * capacity, _GROW))
            new_cap = whole_blocks(new_cap)  # whole key blocks (positions past the window stay unused)
        shape = (len(self.layers), self.n_kv, new_cap, self.head_dim)
        k = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        if capacity:
            k[:, :, : self._length] = self._k[:, :, : self._length]
            v[:, :, : self._length] = self._v[:, :, : self._length]
        self._k, self._v = k, v
        ids = torch.zeros(new_cap, dtype=torch.long)
        ids[: self._length] = self._ids[: self._length]
        self._ids = ids
        feat = torch.zeros((new_cap, self.model.config.hidden_size), dtype=self.dtype, device=self.device)
        if capacity:
            feat[: self._length] = self._feat[: self._length]
        self._feat = feat
        aux = torch.zeros((new_cap, len(self.aux_layers), feat.shape[1]), dtype=self.dtype, device=self.device)
        if capacity and self._aux.shape[1:] == aux.shape[1:]:
            aux[: self._length] = self._aux[: self._length]
        self._aux = aux
        # rotary tables for every position the cache can hold, computed in fp32 as transformers does, one per kind
        # of layer with its own (tables, cap, head_dim)
        pos = torch.arange(new_cap, device=self.device, dtype=torch.float32)
        cos32, sin32 = [], []
        half = self.rotary_dims // 2
        for table in self._rotary:
            freqs = torch.outer(pos, table.inv_freq.float().to(self.device))  # (cap, rotated/2)
            if table.long_inv_freq is not None:
                late = pos[table.long_from :]
                freqs[table.long_from :] = torch.outer(late, table.long_inv_freq.float().to(self.device))
            emb = torch.cat((freqs, freqs), dim=-1)  # (cap, rotated dims)
            cos32.append(emb.cos() * table.scale)
            sin = emb.sin() * table.scale
            # rotate_half(x) * sin == roll(x, half) * [-sin | sin] bit for bit, in two fewer operations
            sin32.append(torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))
        self._cos = torch.stack(cos32).to(self.dtype)
        self._sin = torch.stack(sin32).to(self.dtype)
        # the compiled step's tables: fp32, not rounded to the model's dtype
        self._cos32 = torch.stack(cos32).contiguous()
        self._sin32 = torch.stack(sin32).contiguous()

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last: int = 1, tree: TokenTree | None = None) -> torch.Tensor:
        """tokens (T,) -> fp32 logits (last, V). With a `tree` the tokens are its rows: row 0 continues the
        cache, every other row its parent row; each row sees the cache and its own ancestors, at the
        position of its depth. Afterwards `keep()` keeps one root-to-node path."""
        if self.graphs is not None:
            with self.graphs.recording:  # not while a graph is being recorded (a moment, once per bucket)
                return self._vocab_cut(self._forward(tokens, last, tree))
        return self._vocab_cut(self._forward(tokens, last, tree))

    def _forward(self, tokens: torch.Tensor, last: int, tree: TokenTree | None) -> torch.Tensor:
        t = tokens.shape[0]
        start = self._length
        end = start + t
        self._reserve(end)
        self._ids[start:end] = tokens.cpu()
        if start == 0:  # a new answer: it runs in one mode throughout
            self._fast = step_for(self)
        if tree is not None and (start == 0 or len(tree) != t):
            raise ValueError("a tree continues a non-empty cache, one row per token")
        if self._fast is not None and (start > 0 or t == 1 or prompt_through_step(self._fast, self.dtype)):
            return forward_compiled(self, tokens, last, tree, start)
        rows = bucket(t, self.floor) if self.static and start > 0 else None
        if rows is not None:
            return forward_static(self, tokens, last, tree, start, rows)
        self._kt_len = min(self._kt_len, start)  # the eager pass writes _k only
        run = in_rows if self.consistent else call
        x = self.embed(tokens.to(self.device))  # (rows, D)
        if tree is None:
            cos = self._cos[:, start:end]  # (tables, T, hd)
            sin = self._sin[:, start:end]
            plans = {w: pass_plan(start, t, w, self.groups, self.blocked, self.device) for w in self._windows}
        else:
            depths = tree.depths(self.device)
            positions = start + depths  # (T,)
            cos = self._cos[:, positions]
            sin = self._sin[:, positions]
            ancestors = tree.ancestors(self.device)
            plans = {w: tree_plan(start, ancestors, depths, w, self.groups, self.blocked, self.device) for w in self._windows}
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                self._aux[start:end, self.aux_layers.index(i)] = x
            x = layer_pass(self, i, layer, x, cos, sin, start, t, plans, run)
        self._length = end
        self._feat[start:end] = x
        return self._scaled(run(self.lm_head, rms_norm(x[-last:], self.norm)).float())  # (last, V)

    def limit_vocab(self, n: int) -> None:
        """Logits over the ids below n only (0: all of them): a draft model drafting from the tokens its target
        mostly emits. A byte-pair vocabulary numbers its tokens in the order their merges were learned, most
        frequent first, so the lowest ids are the common ones. Where the LM head is a file's blocks, only those
        rows are read (the 0.5B Qwen2.5's head over 151,936 ids is over a third of the bytes a step reads);
        elsewhere the logits are cut after the product. n is rounded up to a whole tile of the packed head."""
        n = max(0, int(n))
        self.head_rows = 0 if n == 0 or n >= self.vocab_size else min(self.vocab_size, -(-n // TILE_COLS) * TILE_COLS)
        self._cut_head = None

    def _head(self, product):
        """The LM head product a pass runs: a file's blocks cut to their first head_rows outputs (limit_vocab);
        any other head as it is (forward cuts its logits)."""
        if not self.head_rows or not isinstance(product, Blocks):
            return product
        if self._cut_head is None or self._cut_head[0] is not product:
            try:
                cut = product.first_rows(self.head_rows)
            except ValueError:  # a head of several parts or with a bias: cut after the product
                cut = product
            self._cut_head = (product, cut)
        return self._cut_head[1]

    def _vocab_cut(self, logits: torch.Tensor) -> torch.Tensor:
        """(rows, V) -> (rows, head_rows) where the vocabulary is cut and the product gave every id."""
        return logits[:, : self.head_rows] if self.head_rows and logits.shape[-1] > self.head_rows else logits

    def _idle_inputs(self, rows: int) -> StepInputs:
        """A step of padding rows only (they write the scratch slot): what graphs are captured on."""
        return step_inputs(self.max_len, rows, torch.zeros(0, dtype=torch.long), 0, self.device)

    def _buffers(self) -> tuple:
        """What a captured step reads and writes: the buffers by identity, and the layers whose states it keeps."""
        return (self.aux_layers, self._k, self._v, self._feat, self._aux, self._cos, self._sin)

    def _step_copies(self) -> None:
        """The compiled step's transposed keys and bf16 values, allocated again (and filled from _k and _v) when the
        cache grew."""
        narrow = self._v.shape if self.narrow_values else (0,)
        if self._kt.numel() != self._k.numel() or self._vn.shape != narrow:
            layers, kv, cap, hd = self._k.shape
            self._kt = torch.zeros((layers, kv, cap // 16, hd, 16), dtype=torch.float32, device=self.device)
            self._vn = torch.zeros(narrow, dtype=torch.bfloat16, device=self.device)
            self._kt_len = 0

    def keep_layers(self, layers: tuple[int, ...]) -> None:
        """From the next prompt on, keep the hidden states entering these layers for every position
        (`aux_features`); () keeps none."""
        layers = tuple(sorted(set(int(i) for i in layers)))
        if any(not 0 <= i < len(self.layers) for i in layers):
            raise ValueError(f"layers {layers} are not all among the model's {len(self.layers)}")
        if layers != self.aux_layers:
            self.aux_layers = layers
            self._length = self._kt_len = 0  # the cache holds no such states yet: read again from the start
            self._aux = torch.zeros((self._feat.shape[0], len(layers), self._feat.shape[-1] if self._feat.ndim == 2 else 0),
                                    dtype=self.dtype, device=self.device)
            if self.graphs is not None:  # the captured steps wrote the old buffer
                self.graphs.start()

    def aux_features(self, start: int, end: int) -> torch.Tensor:
        """The kept layers' hidden states of cached positions start..end-1, side by side in layer order
        (end-start, len(aux_layers) * D)."""
        if not 0 <= start <= end <= self._length:
            raise ValueError(f"positions {start}..{end} are not all in the cache of {self._length}")
        return self._aux[start:end].reshape(end - start, -1)

    def features(self, start: int, end: int) -> torch.Tensor:
        """The final hidden states (before the final norm) of cached positions start..end-1, (end-start, D)."""
        if not 0 <= start <= end <= self._length:
            raise ValueError(f"positions {start}..{end} are not all in the cache of {self._length}")
        return self._feat[start:end]

    @torch.inference_mode()
    def keep(self, start: int, rows: list[int]) -> None:
        """After a tree pass that began at `start`: keep the rows `rows` (a root-to-node path, row 0 first)
        as positions start, start+1, ...; drop the rest."""
        index = torch.tensor(rows, device=self.device)
        if rows != list(range(len(rows))):
            target = torch.arange(start, start + len(rows), device=self.device)
            self._k[:, :, target] = self._k[:, :, start + index]
            self._v[:, :, target] = self._v[:, :, start + index]
            self._feat[target] = self._feat[start + index]
            self._ids[start : start + len(rows)] = self._ids[start + index.cpu()]
            if self.aux_layers:
                self._aux[target] = self._aux[start + index]
            self._kt_len = min(self._kt_len, start)
        self._length = start + len(rows)
        self._kt_len = min(self._kt_len, self._length)  # the dropped rows' slots are rewritten later

    def _project(self, layer: LayerWeights, x: torch.Tensor, cos, sin, run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed rows (T, D) -> queries (H, T, hd), keys and values (KV, T, hd), rotary applied."""
        t = x.shape[0]
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        flat = run(layer.qkv, x)
        if layer.whole_qk_norms:  # OLMo 2: all query heads normed together, and all key heads
            flat = torch.cat((rms_norm(flat[:, : h * hd], layer.q_norm), rms_norm(flat[:, h * hd : (h + kv) * hd], layer.k_norm),
                              flat[:, (h + kv) * hd :]), dim=1)
        qkv = flat.view(t, h + 2 * kv, hd).transpose(0, 1)  # (H+2KV, T, hd)
        v = qkv[h + kv :]  # (KV, T, hd)
        if layer.q_norm is not None and not layer.whole_qk_norms:
            qk = torch.cat((rms_norm(qkv[:h], layer.q_norm), rms_norm(qkv[h : h + kv], layer.k_norm)))
        else:
            qk = qkv[: h + kv]
        if layer.rotary:  # rotary on queries and keys at once, with the table of the layer's kind
            cos, sin = cos[layer.rope_set], sin[layer.rope_set]
            rd = self.rotary_dims
            if rd == self.head_dim:
                qk = qk * cos + qk.roll(rd // 2, -1) * sin
            else:  # the first rd dimensions of each head rotate, the rest pass as they are (Phi-4-mini)
                rot = qk[..., :rd]
                qk = torch.cat((rot * cos + rot.roll(rd // 2, -1) * sin, qk[..., rd:]), dim=-1)
        return qk[:h], qk[h:], v

    def _attention(self, i: int, layer: LayerWeights, x, cos, sin, start: int, t: int, plan: Plan, run):
        """A layer's attention over normed rows x (T, D), its keys and values written to the cache, by the pass's plan
        -> the output projection's rows (T, D)."""
        end = start + t
        q, k, v = self._project(layer, x, cos, sin, run)
        self._k[i, :, start:end] = k
        self._v[i, :, start:end] = v
        out = plan.attend(self.heads, q, k, v, self._k[i], self._v[i], end)  # (H, T, hd)
        return run(layer.o_proj, out.transpose(0, 1).reshape(t, -1))
