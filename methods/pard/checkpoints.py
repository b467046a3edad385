"""PARD's checkpoint fields: a PARD draft (amd/PARD-* on the hub, or one trained here) is a standard Hugging Face
causal LM folder whose config.json adds the mask token's id as `pard_token` (upstream's `pard_train.py` writes it
with `spd_type: "pard"`); read as vLLM 0.32's parallel drafting reads it (`mask_token_id`, else `pard_token`, else
`ptd_token_id`). The draft itself loads as SpS's does (methods/sps/draft.py, strictly)."""
from __future__ import annotations

from bench.errors import InvalidArtifactError

PARD_TYPE = "pard"
MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")  # vLLM's order (llm_base_proposer.py)


def mark_parallel(config, mask_token_id: int) -> None:
    """Write PARD's fields into a draft's config (saved with it)."""
    config.pard_token = int(mask_token_id)
    config.spd_type = PARD_TYPE


def parallel_token(config, source, train_command: str) -> int:
    """The mask token id of a PARD draft's config; one line when it has none or one outside its vocabulary."""
    key = next((key for key in MASK_TOKEN_KEYS if getattr(config, key, None) is not None), None)
    token = None if key is None else getattr(config, key)
    fix = f"use an amd/PARD-* checkpoint or make one with: {train_command}"
    if key is None or isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArtifactError(f"'{source}' is not a PARD draft: its config.json has no integer pard_token (the "
                                   f"mask token's id; found {token!r}); {fix}")
    if not 0 <= token < config.vocab_size:
        raise InvalidArtifactError(f"PARD draft '{source}' has {key}={token}, outside its vocabulary of "
                                   f"{config.vocab_size} tokens; {fix}")
    return token
