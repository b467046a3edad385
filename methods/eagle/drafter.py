"""EAGLE (Li et al. 2024): a one-decoder-layer draft that autoregresses on the target's own features.

The head maps (embedding of token t+1, target feature f_t) through fc: 2H -> H and one decoder layer of the target's
own architecture (built from its config class, first input norm skipped, no final norm) to a guess of f_{t+1}; the
target's LM head (or a draft-vocabulary slice of it) turns that into the next token's distribution. The head keeps
its own KV cache over (token, feature) pairs: after each verification it consumes the target's features at the
accepted rows, so its cache always holds the accepted context; the tree's rows are dropped again after drafting.

- EAGLE-1 (`method=eagle`): a static tree given as a choices list (like Medusa's: a path of top-k ranks), expanded
  level by level, one head forward per level.
- EAGLE-2 (`method=eagle2`): a dynamic tree built as upstream's `topK_genrate` builds it: the root's `top_k`
  children, then `depth` expansions of the `top_k` frontier nodes of highest cumulative log-probability, each
  adding all `top_k` x `top_k` children as candidates; the `total_token - 1` best candidates are verified, so a step
  verifies `total_token` tokens with the root (60 at upstream's 60/5/10). Drafted by top-k under sampling too (as
  upstream): a deterministic tree that the engine verifies with the target's probabilities alone.

EAGLE-1 proposes the top-k children under greedy decoding; under sampling a node's children are drawn from the
draft's q without replacement and the tree says so, so that the engine's rule removes a rejected token from q before
the next sibling. Both are lossless.

Checkpoints: this project's, or SafeAILab's EAGLE-1/2 heads as their `EaModel` builds them (see `load_eagle`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, DynamicCache

from bench.engine.drafter import Drafter
from bench.engine.kvcache import new_cache
from bench.errors import InvalidArtifactError
from bench.artifacts import artifact_fingerprint
from bench.engine.sampling import SamplingConfig, logits_to_probs
from bench.engine.tree import DraftTree
from methods.heads.common import (DraftVocabulary, checkpoint_folder, heads_or_checkpoint, load_strictly,
                                  one_layer_config, read_heads, read_json, read_tensors)
from methods.heads.trees import resolve_choices

TRAIN_COMMAND = "python -m bench.train method=eagle"


class EagleHead(nn.Module):
    """fc(concat(embedding, feature)) -> one decoder layer -> predicted next feature."""

    def __init__(self, target_config, bias: bool = True):
        super().__init__()
        hidden = target_config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
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


def unrolled_mask(length: int, step: int, batch: int, device: torch.device) -> torch.Tensor:
    """[batch, 1, length, (step + 1) x length] bool (True: attend) of unrolled step `step` over the head's cache of the
    earlier steps: the query at position t (the draft `step` tokens beyond t) sees the step-0 keys 0..t (the
    target's real features up to t) and, of each later step, only the key at t (its own earlier draft positions)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * step, dim=-1)[None, None].expand(batch, 1, -1, -1)


def ahead(values: torch.Tensor, shift: int, length: int) -> torch.Tensor:
    """values[:, shift : shift + length], zero-padded (False for masks) at the end to `length` positions."""
    out = values[:, shift : shift + length]
    missing = length - out.shape[1]
    if missing <= 0:
        return out
    return torch.cat([out, out.new_zeros((out.shape[0], missing, *out.shape[2:]))], dim=1)


def eagle_loss(head: EagleHead, vocab: DraftVocabulary, embed: nn.Embedding, batch, noise: float = 0.2,
               feature_weight: float = 1.0, token_weight: float = 0.1, ttt_steps: int = 1, ttt_decay: float = 0.8,
               eval_depths: int = 4):
    """EAGLE's objective on a batch of cached features, with EAGLE-3's training-time test: sum over unrolled steps
    k < ttt_steps of ttt_decay^k x (SmoothL1 between the predicted and the target's feature + token_weight x
    cross-entropy against the target's next prediction). Input features (step 0's) get uniform noise
    U(-noise/2, noise/2) in training. Returns (loss, [(logits [N, V'], target slice positions [N]) per step]).

    Step 0 at position t reads (token t+1, the target's feature f_t) and predicts f_{t+1}, teacher-forced as EAGLE-1.
    Step k at t reads (token t+k+1, the head's own step k-1 output at t, its guess of f_{t+k}) at rotary position
    t+k and predicts f_{t+k+1}, attending to the real features 0..t and its own steps 1..k at t (`unrolled_mask`):
    exactly what drafting k+1 tokens beyond an accepted position t computes, the draft's tokens taken as the
    corpus's. In eval mode max(ttt_steps, eval_depths) steps are unrolled, for the held-out agreement per depth.
    A batch with soft targets (Features.soft_ids) has its cross-entropy taken against the target's distribution
    (`soft_cross_entropy`) instead of its argmax."""
    features, outputs = batch.hidden[:, :-1], []  # f_t, for token t+1
    if head.training and noise:
        features = features + (torch.rand_like(features) - 0.5) * noise
    rows, length = features.shape[:2]
    steps = ttt_steps if head.training else max(ttt_steps, eval_depths)
    cache = new_cache() if steps > 1 else None
    positions = torch.arange(length, device=features.device)[None].expand(rows, -1)
    loss = batch.hidden.new_zeros((), dtype=torch.promote_types(batch.hidden.dtype, torch.float32))  # never below float32
    for step in range(steps if length else 0):
        with torch.no_grad():
            embeds = embed(ahead(batch.input_ids, step + 1, length))  # token t+step+1
        mask = None if step == 0 else unrolled_mask(length, step, rows, features.device)
        predicted = head(embeds, features, cache=cache, position_ids=None if step == 0 else positions + step,
                         attention_mask=mask)  # f^_{t+step+1}
        keep = ahead(batch.mask, step + 1, length)
        targets = vocab.slice_positions(ahead(batch.labels, step + 1, length)[keep])  # the target's next token
        logits = vocab(predicted[keep])
        if step < ttt_steps and keep.any():
            soft = None if batch.soft_ids is None else (
                vocab.slice_positions(ahead(batch.soft_ids, step + 1, length)[keep]),
                ahead(batch.soft_logprobs, step + 1, length)[keep])
            loss = loss + ttt_decay ** step * step_loss(predicted[keep], ahead(batch.hidden, step + 1, length)[keep],
                                                        logits, targets, feature_weight, token_weight, loss.dtype, soft)
        outputs.append((logits.detach(), targets))
        features = predicted
    return loss, outputs


def step_loss(predicted: torch.Tensor, wanted: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
              feature_weight: float, token_weight: float, dtype: torch.dtype,
              soft: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One unrolled step's loss: feature_weight x SmoothL1(predicted, wanted feature) + token_weight x cross-entropy
    of the logits against the target slice positions (-100: ignored), or against `soft` (the target's top-k as
    slice positions and log-probabilities: `soft_cross_entropy`). A zero weight drops its term (EAGLE-3 has no
    feature loss, and its features are wider than the head's outputs); so does a step whose targets all lie outside
    the draft vocabulary (cross-entropy over no positions is NaN)."""
    loss = predicted.new_zeros((), dtype=dtype)
    if feature_weight:
        loss = loss + feature_weight * nn.functional.smooth_l1_loss(predicted.to(dtype), wanted.to(dtype))
    if token_weight and bool((targets != -100).any()):
        token_loss = (nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100) if soft is None
                      else soft_cross_entropy(logits, targets, *soft))
        loss = loss + token_weight * token_loss
    return loss


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, soft_positions: torch.Tensor,
                       soft_logprobs: torch.Tensor) -> torch.Tensor:
    """Mean over the rows whose target argmax lies in the draft vocabulary (targets != -100) of -sum_j p_j log q_j:
    q the draft's softmax over its vocabulary (logits [N, V']), p the target's distribution over the draft
    vocabulary (SafeAILab's EAGLE-3 loss), known here from the target's top-k (soft_positions [N, k], their slice
    positions, -100 outside the slice; soft_logprobs [N, k]) and renormalised over those inside the slice."""
    valid = targets != -100
    positions, inside = soft_positions[valid], soft_positions[valid] != -100
    weights = soft_logprobs[valid].float().masked_fill(~inside, float("-inf")).softmax(-1)
    logq = logits[valid].float().log_softmax(-1).gather(-1, positions.clamp(min=0))
    return -(weights * logq).masked_fill(~inside, 0.0).sum(-1).mean()


class EagleRecipe:
    """Training recipe for methods/heads/training.py (EAGLE-1's objective, unrolled `ttt_steps` steps as EAGLE-3's
    training-time test; EAGLE-2 uses the same weights). Held-out agreement is per draft depth."""

    method = "eagle"
    per_depth = True

    def __init__(self, noise: float = 0.2, feature_weight: float = 1.0, token_weight: float = 0.1, ttt_steps: int = 1,
                 ttt_decay: float = 0.8):
        self.noise, self.feature_weight, self.token_weight = noise, feature_weight, token_weight
        self.ttt_steps, self.ttt_decay = ttt_steps, ttt_decay

    def build(self, target, tcfg) -> EagleHead:
        return EagleHead(target.config)

    def loss(self, module: EagleHead, vocab: DraftVocabulary, batch, target):
        return eagle_loss(module, vocab, target.get_input_embeddings(), batch, self.noise, self.feature_weight,
                          self.token_weight, self.ttt_steps, self.ttt_decay)

    def checkpoint_config(self, module: EagleHead, tcfg) -> dict:
        return {"hidden_size": module.fc.out_features}


UPSTREAM_WEIGHTS = ("pytorch_model.bin", "model.safetensors")  # in the order SafeAILab's EaModel tries them
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train a head "
                f"with: {TRAIN_COMMAND}")
# config.json fields of SafeAILab's head that shape its decoder layer (cnets1.py's LlamaDecoderLayer reads them from
# the head's own config, not the base model's); absent ones are the target's
UPSTREAM_LAYER_FIELDS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "hidden_act",
                         "rms_norm_eps", "max_position_embeddings")


def load_eagle(checkpoint: str | Path, target) -> tuple[EagleHead, DraftVocabulary, str]:
    """(head, vocabulary, fingerprint): this project's checkpoint, or SafeAILab's (config.json + pytorch_model.bin or
    model.safetensors with `fc.*` and `layers.0.*`, e.g. yuhuili/EAGLE-Vicuna-7B-v1.3), on the target's device and
    dtype.

    SafeAILab's head is built as EaModel builds it: `fc` with a bias unless config.json says `"bias": false` (the
    LLaMA-3 heads), the decoder layer's sizes, activation, norm epsilon and rotary base (`rope_theta`, else 10000;
    `rope_scaling`) from config.json. Loading is strict; the file keys deliberately dropped are `embed_tokens.weight`
    (the target's own embedding is used: upstream copies it from the base model and keeps it frozen),
    `layers.0.input_layernorm.weight` (EAGLE's first layer has no input norm; upstream never builds one) and
    `*.rotary_emb.inv_freq` (recomputed from the config). Anything else missing, unexpected or mis-shaped is refused
    in one line."""
    folder = checkpoint_folder(checkpoint, "EAGLE")
    lm_head = target.get_output_embeddings()
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    weights = next((folder / n for n in UPSTREAM_WEIGHTS if (folder / n).exists()), None)
    if weights is not None and config and "specbench_method" not in config:
        head = _upstream_head(folder, weights, config, target.config)
        vocab = DraftVocabulary(lm_head)
    else:
        _, state = read_heads(folder, "eagle", TRAIN_COMMAND)
        head = EagleHead(target.config)
        load_strictly(head, {k: v for k, v in state.items() if k != "draft_vocab_ids"}, folder / "model.safetensors",
                      f"remake it with: {TRAIN_COMMAND}")
        vocab = DraftVocabulary(lm_head, state.get("draft_vocab_ids"))
    return head.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _upstream_head(folder: Path, weights: Path, config: dict, target_config) -> EagleHead:
    """SafeAILab's one-layer head for this target, built from its config.json and loaded strictly."""
    hidden, layers = config.get("hidden_size", target_config.hidden_size), config.get("num_hidden_layers", 1)
    if hidden != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} is an EAGLE head for hidden size {hidden}, the target's is "
                                   f"{target_config.hidden_size}; use the head made for this target model")
    if layers != 1:
        raise InvalidArtifactError(f"{folder} is an EAGLE head of {layers} decoder layers; methods/eagle.py loads "
                                   f"one-layer EAGLE-1/2 heads (train one with: {TRAIN_COMMAND})")
    head = EagleHead(_upstream_layer_config(target_config, config), bias=bool(config.get("bias", True)))
    load_strictly(head, read_tensors(weights, UPSTREAM_FIX), weights, UPSTREAM_FIX, file_key=_from_upstream_keys,
                  provided={"body.embed_tokens.weight"}, dropped=_dropped_upstream_key)
    return head


def _upstream_layer_config(target_config, config: dict):
    """The target's config with the decoder-layer fields SafeAILab's head takes from its own config.json."""
    fields = {k: v for k, v in target_config.to_dict().items() if k not in ("rope_parameters", "rope_scaling")}
    fields.update({k: config[k] for k in UPSTREAM_LAYER_FIELDS if k in config})
    if "num_attention_heads" in config:  # upstream's EConfig: no num_key_value_heads means multi-head attention
        fields["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    fields["rope_theta"], fields["rope_scaling"] = config.get("rope_theta", 10000.0), config.get("rope_scaling")
    return type(target_config)(**fields)


def _from_upstream_keys(key: str) -> str:
    """EagleHead key -> SafeAILab's: `fc.*` as is, `body.layers.0.*` -> `layers.0.*`."""
    return key.removeprefix("body.")


def _dropped_upstream_key(name: str) -> bool:
    return name in ("embed_tokens.weight", "layers.0.input_layernorm.weight") or name.endswith("rotary_emb.inv_freq")


class EagleDrafter(Drafter):
    """EAGLE-1 (static `choices` tree) or EAGLE-2 (dynamic tree: `total_token`, `depth`, `top_k`) over one head."""

    feature_layers = (-1,)
    samples = True

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

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
            return None
        root_feature = self._feed_pending(context)  # f^ at the root's position: predicts the depth-1 tokens
        if self.static_children is None:
            return self._dynamic_tree(root_feature)
        return self._static_tree(root_feature)

    # --- EAGLE-2: the dynamic tree, as upstream's `topK_genrate` builds it --------------------------------------

    def _dynamic_tree(self, root_feature: torch.Tensor) -> DraftTree | None:
        """EAGLE-2's tree. Level 1 is the root's top_k children; then `depth` expansions, each feeding the current
        frontier (top_k nodes) through the head and scoring all top_k x top_k children by cumulative log q; the next
        frontier is the best top_k of those. Every drafted node (top_k + depth x top_k^2 of them) is a candidate; the
        total_token - 1 best are verified (with the root: total_token tokens), best first, so that a prefix of the
        tree is the best smaller tree. Drafted by top-k under sampling too, as upstream does: the tree carries no
        draft probabilities and the engine verifies it with the target's alone (lossless: distinct deterministic
        siblings)."""
        if self.total_token <= 1:
            return None
        k = min(self.top_k, self.vocab.size)
        logq = self.vocab(root_feature[None]).float().log_softmax(-1)  # [1, V']
        scores, positions = logq.topk(k, dim=-1)  # [1, k]
        pool_positions, pool_scores = [positions[0]], [scores[0]]  # per level, flattened: [k], then [k * k] each
        pool_parents = [torch.full((k,), -1, device=self.device)]  # pool index of each node's parent (-1 root)
        frontier = torch.arange(k, device=self.device)  # pool indices of the nodes fed next
        frontier_scores, frontier_positions = scores[0], positions[0]
        inputs = root_feature[None].expand(k, -1)  # [k, H] each frontier node's parent's predicted feature
        mask = torch.eye(k, dtype=torch.bool, device=self.device)  # [k, fed] frontier rows x fed tree rows
        size = k
        for level in range(self.depth):
            features = self._feed_level(self.vocab.to_token_ids(frontier_positions), inputs, mask, level)  # [k, H]
            child_scores, child_positions = self.vocab(features).float().log_softmax(-1).topk(k, dim=-1)  # [k, k]
            cumulative = (frontier_scores[:, None] + child_scores).flatten()  # [k * k]
            pool_positions.append(child_positions.flatten())
            pool_scores.append(cumulative)
            pool_parents.append(frontier.repeat_interleave(k))
            if level == self.depth - 1:  # the last expansion's children are candidates only, never fed
                break
            best = cumulative.topk(k).indices  # the next frontier, as indices into this level's k * k children
            frontier, frontier_scores = size + best, cumulative[best]
            frontier_positions, inputs = child_positions.flatten()[best], features[best // k]
            mask = torch.cat([mask[best // k], torch.eye(k, dtype=torch.bool, device=self.device)], dim=1)
            size += k * k
        scores = torch.cat(pool_scores)
        keep = scores.sort(descending=True, stable=True).indices[: self.total_token - 1]  # ties: the older node
        tokens, parents, kept = torch.stack([self.vocab.to_token_ids(torch.cat(pool_positions)[keep]),
                                             torch.cat(pool_parents)[keep], keep]).tolist()  # the one host read
        index = {old: new for new, old in enumerate(kept)}
        assert all(p < 0 or p in index for p in parents), "a child never outranks its parent"
        return DraftTree(tokens, [index[p] if p >= 0 else -1 for p in parents])

    def _feed_level(self, token_ids: torch.Tensor, inputs: torch.Tensor, mask: torch.Tensor,
                    level: int) -> torch.Tensor:
        """Feed one tree level (pairs of a node's token and its parent's predicted feature) after the cached context
        and the levels fed before; `mask` [rows, fed] says which fed tree rows (this level's last) each row sees.
        Returns the rows' predicted features [rows, H]."""
        n, rows = self.context_len, len(token_ids)
        attend = torch.cat([torch.ones(rows, n, dtype=torch.bool, device=self.device), mask], dim=1)
        additive = torch.zeros(attend.shape, dtype=self.dtype, device=self.device)
        additive.masked_fill_(~attend, self._min_value)
        positions = torch.full((1, rows), n + level, device=self.device)
        return self.head(self.embed(token_ids[None]), inputs[None], cache=self.cache, position_ids=positions,
                         attention_mask=additive[None, None])[0]

    # --- EAGLE-1: the static tree ----------------------------------------------------------------------------------

    def _static_tree(self, root_feature: torch.Tensor) -> DraftTree | None:
        """EAGLE-1's tree: the `choices` paths, level by level (one head forward per level but the last). Under
        sampling a node's children are drawn from q without replacement and the tree says so (EAGLE's own rule)."""
        n = self.context_len
        self._outputs = {-1: root_feature}  # node -> the head's predicted feature after it
        tokens: list[int] = []
        parents: list[int] = []
        paths: list[tuple] = []
        probs: list[torch.Tensor] = []
        frontier = [-1]  # nodes whose children come next (-1: the root)
        frontier_features = root_feature[None]  # [f, H]
        for level in range(1, self.depth + 1):
            count = max(self.static_children.get(paths[node] if node >= 0 else (), 0) for node in frontier)
            if count == 0:
                break
            positions, q = self._children(self.vocab(frontier_features), min(count, self.vocab.size))
            count = positions.shape[1]  # [f, count]: fewer where q has fewer nonzero tokens
            new_nodes = [(r, k) for r, node in enumerate(frontier) for k in range(count)
                         if (paths[node] if node >= 0 else ()) + (k,) in self.static_paths]
            if not new_nodes:
                break
            rows = torch.tensor([r for r, _ in new_nodes], device=self.device)
            ranks = torch.tensor([k for _, k in new_nodes], device=self.device)
            node_tokens = self.vocab.to_token_ids(positions[rows, ranks]).tolist()
            first = len(tokens)
            for (r, k), token in zip(new_nodes, node_tokens):
                parent = frontier[r]
                tokens.append(token)
                parents.append(parent)
                paths.append((paths[parent] if parent >= 0 else ()) + (k,))
                if q is not None:
                    probs.append(q[r])
            if level == self.depth:
                break
            frontier = list(range(first, len(tokens)))
            frontier_features = self._tree_forward(tokens, parents, frontier, n)
        if not tokens:
            return None
        return DraftTree(tokens, parents, torch.stack(probs) if probs else None,
                         "without_replacement" if probs else "independent")

    def _children(self, logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(slice positions [rows, count], q over the full vocabulary [rows, vocab] or None) of each row's children:
        top-count under greedy, drawn without replacement under sampling."""
        if self.sampling.greedy:
            return logits.topk(count, dim=-1).indices, None
        q = logits_to_probs(logits, self.sampling)  # [rows, V']
        count = min(count, int((q > 0).sum(-1).min()))
        positions = torch.multinomial(q.cpu(), count, replacement=False, generator=self.generator).to(q.device)
        return positions, self.vocab.full_probs(q)

    @staticmethod
    def _ancestors(node: int, parents: list[int]) -> list[int]:
        out = []
        while parents[node] >= 0:
            node = parents[node]
            out.append(node)
        return out

    def _tree_forward(self, tokens: list[int], parents: list[int], new: list[int], n: int) -> torch.Tensor:
        """Feed the nodes `new` as pairs (their token, their parent's predicted feature) at depth positions with a
        tree mask over the cached context and the tree rows fed before; returns their predicted features [len, H].
        The mask is built on the host and copied once."""
        fed = self.cache.get_seq_length() - n  # tree rows already in the head's cache: nodes 0 .. fed-1
        ids = torch.tensor([[tokens[i] for i in new]], device=self.device)
        features = torch.stack([self._outputs[parents[i]] for i in new])[None]
        ancestry = [self._ancestors(i, parents) for i in new]
        mask = torch.full((len(new), n + fed + len(new)), self._min_value, dtype=self.dtype)
        mask[:, :n] = 0
        for row, ancestors in enumerate(ancestry):
            mask[row, [n + a for a in ancestors] + [n + fed + row]] = 0
        positions = torch.tensor([[n + len(a) for a in ancestry]], device=self.device)
        out = self.head(self.embed(ids), features, cache=self.cache, position_ids=positions,
                        attention_mask=mask.to(self.device)[None, None])[0]
        for row, node in enumerate(new):
            self._outputs[node] = out[row]
        return out
