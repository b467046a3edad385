"""This project's MLPSpeculator stages rewritten in IBM's accelerator layout, the one vLLM's `method: mlp_speculator`
(and TGI) loads, drafting the same candidates:

    python -m methods.mlp_speculator.to_vllm <our checkpoint folder> <out folder> [model=smollm2_135m]

IBM's stages have private [vocab, inner_dim] tables and no head bias; ours read the target's embedding through
`emb_in.{i}` and score through `out.{i}` (with a bias) into the target's LM head or its draft-vocabulary slice. The
rewrite is exact up to rounding and the norms' eps: emb_i = E emb_in_i^T and head_i = W out_i for the slice's rows
W of the LM head; one more inner dimension holds a constant (its norm weight 0, bias 1, so GELU(1) after the norm),
through which head_i adds the bias W b_i and gives the tokens outside the slice a logit of -1e4. The extra
dimension changes inner_dim, and with it the norm's mean and emb_weight; the norm weights and the embeddings are
rescaled by sqrt(H / (H + 1)) to match. The folder is big (2 n_predict tables of vocab x (H + 1); SmolLM2: 340 MB in
fp16) and is not committed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from methods.heads.common import DraftVocabulary
from methods.heads.convert import convert_checkpoint
from methods.mlp_speculator.head import SharedVocabMLPSpeculator

CONSTANT_BIAS = 1.0  # the constant dimension's value before GELU
OUTSIDE_SLICE_LOGIT = -1.0e4  # tokens outside the draft vocabulary (fp16-safe)


def ibm_layout(stages: SharedVocabMLPSpeculator, vocab: DraftVocabulary) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, float32 tensors) of `stages` in IBM's layout, for the target whose embedding they hold and
    whose LM head `vocab` reads."""
    hidden, n_predict = stages.inner_dim, stages.n_predict
    shrink = math.sqrt(hidden / (hidden + 1))
    constant = torch.nn.functional.gelu(torch.tensor(CONSTANT_BIAS, dtype=torch.float64))
    embedding = stages.target_embedding.double()
    lm_head = vocab.weight.double()  # [V', H]: the draft vocabulary's rows of the LM head
    bias = vocab.bias.double() if vocab.bias is not None else torch.zeros(vocab.size, dtype=torch.float64)
    tensors = {}
    for i in range(n_predict):
        proj = stages.proj[i].weight.double()
        tensors[f"proj.{i}.weight"] = _pad(proj, rows=1, cols=0 if i == 0 else 1)
        tensors[f"emb.{i}.weight"] = _pad(embedding @ stages.emb_in[i].weight.double().T * shrink, cols=1)
        ln = stages.ln[i]
        tensors[f"ln.{i}.weight"] = torch.cat([ln.weight.double() * shrink, torch.zeros(1, dtype=torch.float64)])
        tensors[f"ln.{i}.bias"] = torch.cat([ln.bias.double(), torch.full((1,), CONSTANT_BIAS, dtype=torch.float64)])
        out = stages.out[i]
        head = torch.zeros(vocab.vocab_size, hidden + 1, dtype=torch.float64)
        head[:, hidden] = OUTSIDE_SLICE_LOGIT / constant
        rows = vocab.to_token_ids(torch.arange(vocab.size, device=lm_head.device))
        head[rows, :hidden] = lm_head @ out.weight.double()
        head[rows, hidden] = (lm_head @ out.bias.double() + bias) / constant
        tensors[f"head.{i}.weight"] = head
    config = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator",
              "emb_dim": hidden, "inner_dim": hidden + 1, "vocab_size": vocab.vocab_size, "n_predict": n_predict,
              **stages.candidates, "tie_weights": False, "scale_input": stages.ln0 is not None}
    return config, {name: value.float().contiguous() for name, value in tensors.items()}


def _pad(weight: torch.Tensor, rows: int = 0, cols: int = 0) -> torch.Tensor:
    return torch.nn.functional.pad(weight, (0, cols, 0, rows))


def write_ibm_layout(stages: SharedVocabMLPSpeculator, vocab: DraftVocabulary, out_dir: Path,
                     dtype: torch.dtype = torch.float16) -> None:
    """config.json and model.safetensors (fp16 by default, as IBM publishes) of ibm_layout in `out_dir`."""
    config, tensors = ibm_layout(stages, vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype) for k, v in tensors.items()}, out_dir / "model.safetensors", metadata={"format": "pt"})
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    """The command in the module docstring."""
    from methods.mlp_speculator.checkpoints import load_mlp_speculator

    convert_checkpoint(argv, __doc__, load_mlp_speculator, SharedVocabMLPSpeculator,
                       write_ibm_layout, "IBM's accelerator layout: vLLM's method mlp_speculator")

if __name__ == "__main__":
    main()
