"""EAGLE (Li et al. 2024): a one-decoder-layer draft that autoregresses on the target's own features.

The head maps (embedding of token t+1, target feature f_t) through fc: 2H -> H and one decoder layer of the target's
own architecture (built from its config class, first input norm skipped, no final norm) to a guess of f_{t+1}; the
target's LM head (or a draft-vocabulary slice of it) turns that into the next token's distribution. The head keeps
its own KV cache over (token, feature) pairs: after each verification it consumes the target's features at the
accepted rows, so its cache always holds the accepted context; the tree's rows are dropped again after drafting.

- EAGLE-1 (`method=eagle`): a static tree given as a choices list (like Medusa's: a path of top-k ranks), expanded
  level by level, one head forward per level.
- EAGLE-2 (`method=eagle2`): a dynamic tree: `depth` levels, each expanding the `top_k` frontier nodes of highest
  cumulative log-probability by their `top_k` best children; then the `total_token - 1` best nodes of all drafted
  are verified.

Greedy decoding proposes the top-k children (deterministic). Under sampling the children of a node are drawn from
the draft's q without replacement and the tree says so, so that the engine's rule removes a rejected token from q
before the next sibling: lossless either way.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, DynamicCache

from bench.kvcache import new_cache
from bench.models import artifact_fingerprint
from bench.sampling import SamplingConfig, logits_to_probs
from bench.tree import DraftTree
from methods.heads import DraftVocabulary, checkpoint_folder, heads_or_checkpoint, read_heads
from methods.trees import resolve_choices

TRAIN_COMMAND = "python -m bench.train method=eagle"


def one_layer_config(target_config):
    """The target's config cut to one decoder layer and a one-row embedding table (inputs come as embeddings)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:1]
    config.vocab_size, config.pad_token_id = 1, None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


class EagleHead(nn.Module):
    """fc(concat(embedding, feature)) -> one decoder layer -> predicted next feature."""

    def __init__(self, target_config):
        super().__init__()
        hidden = target_config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        self.body = AutoModel.from_config(one_layer_config(target_config))  # rotary embeddings, masks, cache: HF's
        self.body.norm = nn.Identity()  # EAGLE has no final norm
        layer = self.body.layers[0]
        if hasattr(layer, "input_layernorm"):  # EAGLE skips the first layer's input norm: features are normed
            layer.input_layernorm = nn.Identity()

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache: DynamicCache | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds, features: [B, T, H] -> [B, T, H] predicted features (of the next position)."""
        inputs = self.fc(torch.cat([embeds, features], dim=-1))
        return self.body(inputs_embeds=inputs, cache=cache, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=cache is not None).last_hidden_state


def eagle_loss(head: EagleHead, vocab: DraftVocabulary, embed: nn.Embedding, batch, noise: float = 0.2,
               feature_weight: float = 1.0, token_weight: float = 0.1, eval_depths: int = 4):
    """EAGLE's objective on a batch of cached features: SmoothL1 between the predicted and the target's next
    feature + token_weight x cross-entropy against the target's next prediction; input features get uniform noise
    U(-noise/2, noise/2) in training. Returns (loss, [(logits [N, V'], target slice positions [N]) per depth]).

    Depth 0 is the teacher-forced step the loss trains. In eval mode `eval_depths` - 1 more depths are unrolled
    for the held-out agreement: at depth d every input feature is the head's own depth d-1 prediction (EAGLE-3's
    "training-time test"), so a draft d + 1 tokens deep is scored on what the head itself predicted. At inference
    the context before the draft holds the target's true features, so these figures are a lower bound."""
    features, shift, outputs, loss = batch.hidden[:, :-1], 1, [], None  # f_t, for token t+1
    if head.training and noise:
        features = features + (torch.rand_like(features) - 0.5) * noise
    for depth in range(1 if head.training else eval_depths):
        length = features.shape[1]
        if length < 1:
            break
        with torch.no_grad():
            embeds = embed(batch.input_ids[:, shift : shift + length])  # token t+shift
        predicted = head(embeds, features)  # f^_{t+shift}
        keep = batch.mask[:, shift : shift + length]
        targets = vocab.slice_positions(batch.labels[:, shift : shift + length][keep])  # the target's next token
        logits = vocab(predicted[keep])
        if depth == 0:
            wanted = batch.hidden[:, 1:][keep]
            loss = (feature_weight * nn.functional.smooth_l1_loss(predicted[keep], wanted)
                    + token_weight * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100))
        outputs.append((logits.detach(), targets))
        features, shift = predicted[:, :-1], shift + 1
    return loss, outputs


class EagleRecipe:
    """Training recipe for methods/training.py (EAGLE-1 objective; EAGLE-2 uses the same weights)."""

    method = "eagle"

    def __init__(self, noise: float = 0.2, feature_weight: float = 1.0, token_weight: float = 0.1):
        self.noise, self.feature_weight, self.token_weight = noise, feature_weight, token_weight

    def build(self, target, tcfg) -> EagleHead:
        return EagleHead(target.config)

    def loss(self, module: EagleHead, vocab: DraftVocabulary, batch, target):
        return eagle_loss(module, vocab, target.get_input_embeddings(), batch, self.noise, self.feature_weight,
                          self.token_weight)

    def checkpoint_config(self, module: EagleHead, tcfg) -> dict:
        return {"hidden_size": module.fc.out_features}


def load_eagle(checkpoint: str | Path, target) -> tuple[EagleHead, DraftVocabulary, str]:
    """(head, vocabulary, fingerprint): this project's checkpoint, or SafeAILab's (config.json + pytorch_model.bin
    with `fc.*` and `layers.0.*`, e.g. yuhuili/EAGLE-Vicuna-7B-v1.3), on the target's device and dtype."""
    folder = checkpoint_folder(checkpoint, "EAGLE")
    head = EagleHead(target.config)
    lm_head = target.get_output_embeddings()
    upstream = next((folder / n for n in ("pytorch_model.bin", "model.safetensors") if (folder / n).exists()), None)
    config_path = folder / "config.json"
    if upstream is not None and config_path.exists() and '"specbench_method"' not in config_path.read_text():
        state = (torch.load(upstream, map_location="cpu", weights_only=True) if upstream.suffix == ".bin"
                 else load_file(upstream))
        head.load_state_dict(_from_upstream_keys(state), strict=False)
        vocab = DraftVocabulary(lm_head)
    else:
        _, state = read_heads(folder, "eagle", TRAIN_COMMAND)
        head.load_state_dict({k: v for k, v in state.items() if k != "draft_vocab_ids"})
        vocab = DraftVocabulary(lm_head, state.get("draft_vocab_ids"))
    return head.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _from_upstream_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SafeAILab's `fc.*`, `layers.0.*` -> EagleHead's `fc.*`, `body.layers.0.*` (embeddings and norms dropped: the
    head uses the target's embedding and has no norms of its own)."""
    mapped = {}
    for key, value in state.items():
        if key.startswith("fc."):
            mapped[key] = value
        elif key.startswith("layers.0.") and "input_layernorm" not in key:
            mapped["body." + key] = value
    return mapped


class EagleDrafter:
    """EAGLE-1 (static `choices` tree) or EAGLE-2 (dynamic tree: `total_token`, `depth`, `top_k`) over one head."""

    feature_layers = (-1,)

    def __init__(self, target, tokenizer=None, checkpoint: str = "", choices: str | list[list[int]] | None = None,
                 total_token: int = 60, depth: int = 5, top_k: int = 10, sampling: SamplingConfig | None = None,
                 seed: int | None = None, head: EagleHead | None = None, vocab: DraftVocabulary | None = None):
        self.head, self.vocab, self.artifact = heads_or_checkpoint(head, vocab, checkpoint, target, load_eagle)
        self.embed = target.get_input_embeddings()
        self.sampling = sampling or SamplingConfig()
        self.fallback_seed, self.generator = seed, None  # start() seeds the generator for each turn
        choices = resolve_choices(choices)
        if choices is not None:  # EAGLE-1: children per node from the choices list, by path
            paths = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))
            self.static_children: dict[tuple, int] | None = {}
            for path in paths:
                self.static_children[path[:-1]] = max(self.static_children.get(path[:-1], 0), path[-1] + 1)
            self.depth = max(len(p) for p in paths)
            self.static_paths = set(paths)
        else:
            self.static_children = None
            self.depth, self.top_k, self.total_token = depth, top_k, total_token
        self.device, self.dtype = target.device, target.dtype
        self._min_value = torch.finfo(target.dtype).min

    # --- the head's view of the accepted context ---------------------------------------------------------------

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None, seed: int | None = None) -> None:
        """Per turn: an empty head cache, the prompt's features pending, and the draws (sampling only) from `seed`
        (the engine's drafter seed), or, when the turn has none, from the constructor's `seed`."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.cache = new_cache()  # plain layers: the tree rows can be cropped off again
        self.context_len = 0  # cache length before the last drafted tree (update may come before any proposal)
        self.pending = hidden  # [m, H] target features not yet fed to the head (positions cache_len .. +m-1)

    def update(self, step) -> None:
        surplus = self.cache.get_seq_length() - self.context_len  # the drafted tree's rows
        if surplus:
            self.cache.crop(-surplus)
        accepted = step.hidden[step.acceptance.rows]  # features of the root and the accepted nodes
        self.pending = torch.cat([self.pending, accepted]) if len(self.pending) else accepted

    def _feed_pending(self, context: list[int]) -> torch.Tensor:
        """Feed (token t+1, f_t) for the pending features; returns the head's output at the last one (f^ of the
        root's position). Afterwards the cache holds every position up to the root's predecessor."""
        start = self.cache.get_seq_length()
        tokens = torch.tensor([context[start + 1 : start + 1 + len(self.pending)]], device=self.device)
        out = self.head(self.embed(tokens), self.pending[None], cache=self.cache)
        self.pending = self.pending[:0]
        self.context_len = self.cache.get_seq_length()
        return out[0, -1]

    # --- drafting ------------------------------------------------------------------------------------------------

    def _children(self, logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(slice positions [rows, count], their log q [rows, count], q over the full vocabulary [rows, vocab] or None)
        of each row's children: top-count under greedy, drawn without replacement under sampling."""
        if self.sampling.greedy:
            logq = logits.float().log_softmax(-1)
            values, positions = logq.topk(count, dim=-1)
            return positions, values, None
        q = logits_to_probs(logits, self.sampling)  # [rows, V']
        count = min(count, int((q > 0).sum(-1).min()))
        positions = torch.multinomial(q.cpu(), count, replacement=False, generator=self.generator).to(q.device)
        return positions, q.gather(-1, positions).clamp(min=1e-30).log(), self.vocab.full_probs(q)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        if budget <= 1:
            return None
        root_feature = self._feed_pending(context)  # f^ at the root's position: predicts the depth-1 tokens
        n = self.context_len
        self._outputs = {-1: root_feature}  # node -> the head's predicted feature after it
        # Every drafted node: token (vocabulary id), parent (node index, -1 root), score (cumulative log q), path
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        paths: list[tuple] = []
        probs: list[torch.Tensor] = []
        frontier = [-1]  # nodes whose children come next (-1: the root)
        frontier_features = root_feature[None]  # [f, H]
        frontier_scores = torch.zeros(1, device=self.device)
        for level in range(1, self.depth + 1):
            count = self._child_count(frontier, paths)
            if count == 0:
                break
            positions, logq, q = self._children(self.vocab(frontier_features), min(count, self.vocab.size))
            count = positions.shape[1]  # [f, count]: fewer where q has fewer nonzero tokens
            cumulative = frontier_scores[:, None] + logq
            new_nodes = self._select(frontier, paths, cumulative, count)  # [(frontier row, rank)]
            if not new_nodes:
                break
            rows = torch.tensor([r for r, _ in new_nodes], device=self.device)
            ranks = torch.tensor([k for _, k in new_nodes], device=self.device)
            node_tokens = self.vocab.to_token_ids(positions[rows, ranks]).tolist()
            node_scores = cumulative[rows, ranks]
            first = len(tokens)
            for (r, k), token, score in zip(new_nodes, node_tokens, node_scores.tolist()):
                parent = frontier[r]
                tokens.append(token)
                parents.append(parent)
                scores.append(score)
                paths.append((paths[parent] if parent >= 0 else ()) + (k,))
                if q is not None:
                    probs.append(q[r])
            if level == self.depth:
                break
            # feed the new nodes to the head (tree mask over the context and their ancestors) for the next level
            new = list(range(first, len(tokens)))
            frontier_features = self._tree_forward(tokens, parents, new, n)
            frontier, frontier_scores = new, node_scores
        if not tokens:
            return None
        keep = self._final_nodes(scores, parents)
        remap = {old: i for i, old in enumerate(keep)}
        tree = DraftTree([tokens[i] for i in keep], [remap[parents[i]] if parents[i] >= 0 else -1 for i in keep],
                         torch.stack([probs[i] for i in keep]) if probs else None,
                         "independent" if not probs else "without_replacement")
        return tree

    def _child_count(self, frontier: list[int], paths: list[tuple]) -> int:
        if self.static_children is None:
            return self.top_k
        return max((self.static_children.get(paths[node] if node >= 0 else (), 0) for node in frontier), default=0)

    def _select(self, frontier: list[int], paths: list[tuple], cumulative: torch.Tensor, count: int) -> list[tuple[int, int]]:
        """Which children to create: those in the static tree (EAGLE-1), or the top_k by cumulative score (EAGLE-2)."""
        if self.static_children is not None:
            return [(r, k) for r, node in enumerate(frontier) for k in range(count)
                    if (paths[node] if node >= 0 else ()) + (k,) in self.static_paths]
        best = cumulative.flatten().topk(min(self.top_k, cumulative.numel())).indices.tolist()
        chosen = sorted((i // count, i % count) for i in best)
        if not self.sampling.greedy:  # siblings drawn without replacement: keep a prefix of each node's draws
            chosen = [(r, k) for r, k in chosen if all((r, j) in chosen for j in range(k))]
        return chosen

    def _final_nodes(self, scores: list[float], parents: list[int]) -> list[int]:
        """Node indices to verify, parents before children: all (EAGLE-1), or the total_token - 1 best scores
        (EAGLE-2; a child never outscores its parent, so ancestors come along; ties keep the older node)."""
        if self.static_children is not None or len(scores) <= self.total_token - 1:
            return list(range(len(scores)))
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: self.total_token - 1]
        kept = set(order)
        if not self.sampling.greedy:  # a sibling drawn later than a dropped one must go too
            kept = self._prefix_closed(kept, parents)
        return sorted(i for i in kept if all(p in kept for p in self._ancestors(i, parents)))

    @staticmethod
    def _ancestors(node: int, parents: list[int]) -> list[int]:
        out = []
        while parents[node] >= 0:
            node = parents[node]
            out.append(node)
        return out

    @staticmethod
    def _prefix_closed(kept: set[int], parents: list[int]) -> set[int]:
        siblings: dict[int, list[int]] = {}
        for node, parent in enumerate(parents):
            siblings.setdefault(parent, []).append(node)
        closed = set()
        for group in siblings.values():
            for node in group:  # creation order is draw order
                if node not in kept:
                    break
                closed.add(node)
        return closed

    def _tree_forward(self, tokens: list[int], parents: list[int], new: list[int], n: int) -> torch.Tensor:
        """Feed the nodes `new` as pairs (their token, their parent's predicted feature) at depth positions with a
        tree mask over the cached context and the tree rows fed before; returns their predicted features [len, H]."""
        fed = self.cache.get_seq_length() - n  # tree rows already in the head's cache: nodes 0 .. fed-1
        ids = torch.tensor([[tokens[i] for i in new]], device=self.device)
        features = torch.stack([self._outputs[parents[i]] for i in new])[None]
        depth = [len(self._ancestors(i, parents)) for i in new]
        mask = torch.full((1, 1, len(new), n + fed + len(new)), self._min_value, dtype=self.dtype, device=self.device)
        mask[..., :n] = 0
        for row, node in enumerate(new):
            for ancestor in self._ancestors(node, parents):
                mask[0, 0, row, n + ancestor] = 0
            mask[0, 0, row, n + fed + row] = 0
        positions = torch.tensor([[n + d for d in depth]], device=self.device)
        out = self.head(self.embed(ids), features, cache=self.cache, position_ids=positions, attention_mask=mask)[0]
        for row, node in enumerate(new):
            self._outputs[node] = out[row]
        return out
