"""This project's recurrent drafter rewritten in upstream's layout (apple/ml-recurrent-drafter's `Drafter`, as
`save_pretrained` writes it and `AutoModel.from_pretrained` loads it), drafting the same beams:

    python -m methods.redrafter.to_upstream <our checkpoint folder> <out folder> [model=smollm2_135m]

Ours scores through a projection `lm_head.{L}` [H, exit_dim] into the target's LM head (or its draft-vocabulary
slice); upstream's final layer is a [vocab, exit_dim] table with no bias. The rewrite is exact up to rounding: the
table is W lm_head.{L} for the slice's rows W of the target's LM head, and one more exit dimension holds a constant
1 (input_proj's bias; each ResBlock leaves it alone: its row of A is zero and its bias -100, so SiLU adds 0), through
which the table adds the target LM head's bias and gives the tokens outside the slice a logit of -1e4 (below the 50
best that upstream's drafter keeps). The folder is big (a vocab x (exit_dim + 1) table; SmolLM2: 227 MB in float32)
and is not committed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from methods.heads.common import DraftVocabulary
from methods.heads.convert import convert_checkpoint
from methods.redrafter.checkpoints import MODEL_TYPE
from methods.redrafter.head import SharedVocabRecurrentDrafter

OUTSIDE_SLICE_LOGIT = -1.0e4
SILENT_BIAS = -100.0  # SiLU(-100) is 0 in float32: a ResBlock adds nothing to the constant dimension


def upstream_layout(drafter: SharedVocabRecurrentDrafter, vocab: DraftVocabulary) -> tuple[dict, dict]:
    """(config.json, float32 tensors) of `drafter` in upstream's layout, for the target whose LM head `vocab`
    reads."""
    hidden, exit_dim, layers = drafter.hidden_size, drafter.exit_dim, drafter.num_draft_layers
    state = {k: v.double() for k, v in drafter.state_dict().items()}
    proj = state.get("input_proj.weight", torch.eye(2 * hidden, dtype=torch.float64))
    proj_bias = state.get("input_proj.bias", torch.zeros(exit_dim, dtype=torch.float64))
    tensors = {"input_proj.weight": _pad(proj, rows=1),
               "input_proj.bias": torch.cat([proj_bias, torch.ones(1, dtype=torch.float64)])}
    for i in range(layers):
        tensors[f"lm_head.{i}.linear.weight"] = _pad(state[f"lm_head.{i}.linear.weight"], rows=1, cols=1)
        tensors[f"lm_head.{i}.linear.bias"] = torch.cat([state[f"lm_head.{i}.linear.bias"],
                                                         torch.full((1,), SILENT_BIAS, dtype=torch.float64)])
    table = torch.zeros(vocab.vocab_size, exit_dim + 1, dtype=torch.float64)
    table[:, exit_dim] = OUTSIDE_SLICE_LOGIT
    rows = vocab.to_token_ids(torch.arange(vocab.size, device=vocab.weight.device)).cpu()
    table[rows, :exit_dim] = vocab.weight.double().cpu() @ state[f"lm_head.{layers}.weight"]
    table[rows, exit_dim] = 0.0 if vocab.bias is None else vocab.bias.double().cpu()
    tensors[f"lm_head.{layers}.weight"] = table
    tensors |= {k: v for k, v in state.items() if k.startswith("rnn_")}
    config = {"model_type": MODEL_TYPE, "architectures": ["Drafter"], "vocab_size": vocab.vocab_size,
              "hidden_size": hidden, "exit_dim": exit_dim + 1, "num_draft_layers": layers,
              "num_lookback_tokens": -1, "rnn": drafter.rnn}
    return config, {name: value.float().contiguous() for name, value in tensors.items()}


def _pad(weight: torch.Tensor, rows: int = 0, cols: int = 0) -> torch.Tensor:
    return torch.nn.functional.pad(weight, (0, cols, 0, rows))


def write_upstream_layout(drafter: SharedVocabRecurrentDrafter, vocab: DraftVocabulary, out_dir: Path) -> None:
    """config.json and float32 model.safetensors of upstream_layout in `out_dir`."""
    config, tensors = upstream_layout(drafter, vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    """The command in the module docstring."""
    from methods.redrafter.checkpoints import load_redrafter

    convert_checkpoint(argv, __doc__, load_redrafter, SharedVocabRecurrentDrafter,
                       write_upstream_layout, "apple/ml-recurrent-drafter's Drafter layout")

if __name__ == "__main__":
    main()
