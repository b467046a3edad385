"""Where the project and its artifacts live: the project root, the cache directory, artifact paths (local folder or
hub id), installed data packages, and artifact fingerprints for run keys."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from bench.errors import MissingArtifactError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def resolve_artifact_path(path: str | Path) -> Path | None:
    """A local artifact folder (absolute, or relative to the project root, not the cwd); None for a hub id."""
    path = Path(path)
    local = path if path.is_absolute() else PROJECT_ROOT / path
    if local.exists() or path.is_absolute() or path.parts[0] in (".", "..", "artifacts"):
        return local
    return None


RELEASED_MODEL = "model:"  # an artifact path `model:<name>`: conf/model/<name>.yaml's model, installed by the harness


def drafter_source(drafter: dict | None) -> str | None:
    """Where a drafter's weights came from, for the leaderboard: `release: <model>` (a released model the harness
    installs), `trained here: <minutes> min, <tokens> tokens (<data>)` (a local folder's card.json), `hub:
    <id>`, or None for a drafter with no weights (training-free). Reads `checkpoint` or `draft_path`, SAM-Decoding's
    in its fallback's settings."""
    if not drafter:
        return None
    settings = (drafter.get(drafter["fallback"]) or {}) if drafter.get("fallback") else drafter
    path = settings.get("checkpoint") or settings.get("draft_path")
    if not path or path == "???":
        return None
    if str(path).startswith(RELEASED_MODEL):
        return f"release: {str(path).removeprefix(RELEASED_MODEL)}"
    local = resolve_artifact_path(path)
    if local is None:
        return f"hub: {path}"
    try:
        card = json.loads((local / "card.json").read_text())
    except (OSError, ValueError):
        return f"trained here: {path} (no card.json)"
    stints = [stint.get("data") for stint in card.get("stints", [])] or [card.get("data")]
    self_distilled = [isinstance(data, dict) and data.get("source") == "self_distill" for data in stints]
    data = " and ".join([*(["ShareGPT"] if not all(self_distilled) else []),
                         *(["self-distilled answers"] if any(self_distilled) else [])])
    return (f"trained here: {card.get('train_minutes', float('nan')):.0f} min, "
            f"{card.get('tokens_seen', 0) / 1e6:.1f}M tokens ({data})")


def package_dir(package: str, install_hint: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingArtifactError(f"package '{package}' is not installed; fix: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def artifact_fingerprint(path: str | Path) -> str:
    """A short hash identifying a local artifact folder (draft weights, datastore): its file names and sizes and the
    contents of its JSON files (card, config, meta). A path that is not a local folder (a hub id) is returned as is.
    Run keys include it, so a run resumed after its artifact was rebuilt refuses to mix old and new answers."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return str(path)
    digest = hashlib.sha256()
    for file in sorted(f for f in folder.iterdir() if f.is_file()):
        digest.update(f"{file.name}:{file.stat().st_size}\n".encode())
        if file.suffix == ".json":
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """Where derived files (dequantized models, datastores) live: $SPECBENCH_CACHE or ~/.cache/specbench."""
    return Path(os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench")


def partial_folder(out: Path) -> Path:
    """A fresh folder beside `out` to write its files into before publish_folder makes it `out`."""
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


def publish_folder(tmp: Path, out: Path) -> Path:
    """Rename `tmp` to `out` in one step, so that no reader sees half a folder; where another process published
    `out` first, `tmp` is dropped. Returns `out`."""
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same copy first
        shutil.rmtree(tmp)
    return out
