"""Images are data: Pillow reads only the formats the image sources document, in process, and every
failure of its decoders is ``IMAGE: problem`` (an ``InputFileError``), never a traceback or another program.

Pillow picks a decoder by a file's content: a PostScript file named ``.png`` is EPS to it, and its EPS
decoder runs Ghostscript (``gs`` on the PATH). A ``gs`` of ours on the PATH records being run; it never is.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from hyper_parallel.errors import InputFileError  # noqa: E402
from hyper_parallel.models.qwen3_5.images import IMAGE_FORMATS, image_pixels, image_size  # noqa: E402

POSTSCRIPT = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 48\nnewpath 0 0 moveto 64 48 lineto stroke\n"


@pytest.fixture
def recording_gs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``gs`` first on the PATH that writes a marker file when run; the marker's path."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "gs-was-run"
    bin_dir.mkdir()
    gs = bin_dir / "gs"
    gs.write_text(f"#!/bin/sh\necho run > {marker}\nexit 1\n")
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return marker


def test_a_postscript_file_named_png_is_refused_and_ghostscript_never_runs(
    tmp_path: Path, recording_gs: Path
) -> None:
    image = tmp_path / "cat.png"
    image.write_bytes(POSTSCRIPT)
    expected = f"{image}: not an image in a format read here (PNG, JPEG, WEBP, GIF, BMP)"
    for read in (lambda: image_size(image, "data.jsonl:1"), lambda: image_pixels(image, (32, 32))):
        with pytest.raises(InputFileError) as caught:
            read()
        assert str(caught.value.issues[0]) == expected
    assert not recording_gs.exists()


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_every_documented_format_is_read(tmp_path: Path, fmt: str) -> None:
    image = tmp_path / f"red.{fmt.lower()}"
    Image.new("RGB", (40, 30), (255, 0, 0)).save(image, fmt)
    assert image_size(image, "data.jsonl:1") == (40, 30)
    pixels = image_pixels(image, (32, 32))
    assert pixels.shape == (3, 32, 32)
    assert pixels[0].mean().item() > 0.9  # red, in [-1, 1]


@pytest.mark.parametrize("fmt", ["TIFF", "ICO", "PPM", "TGA"])
def test_other_formats_pillow_knows_are_refused(tmp_path: Path, fmt: str) -> None:
    image = tmp_path / "red.png"  # the name does not decide the format
    Image.new("RGB", (40, 30), (255, 0, 0)).save(image, fmt)
    with pytest.raises(InputFileError, match="not an image in a format read here"):
        image_size(image, "data.jsonl:1")


def test_every_decoder_failure_on_damaged_images_is_an_input_file_error(tmp_path: Path) -> None:
    """300 images of the documented formats with bytes flipped or cut: each decodes or is refused at the
    file, with nothing but ``InputFileError`` raised."""
    rng = random.Random(46)
    refused = 0
    for fmt in IMAGE_FORMATS:
        buffer = io.BytesIO()
        Image.new("RGB", (40, 30), (200, 10, 10)).save(buffer, fmt)
        good = buffer.getvalue()
        for _ in range(60):
            damaged = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            if rng.random() < 0.4:
                damaged = damaged[: rng.randrange(len(damaged))]
            image = tmp_path / f"x.{fmt.lower()}"
            image.write_bytes(bytes(damaged))
            problems: list[str] = []
            try:
                image_pixels(image, (32, 32))
            except InputFileError as exc:
                problems.append(str(exc.issues[0]))
            assert all(p.startswith(f"{image}: not an image") for p in problems)
            refused += len(problems)
    assert refused > 50  # the damage was seen, not decoded around


def test_a_decoder_failure_of_any_type_is_an_input_file_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder raising what Pillow does not wrap (a ``RuntimeError`` while converting) is the file's."""
    image = tmp_path / "red.png"
    Image.new("RGB", (40, 30), (255, 0, 0)).save(image)

    def broken(self: object, *args: object) -> None:
        raise RuntimeError("decoder state lost")

    monkeypatch.setattr(Image.Image, "convert", broken)
    with pytest.raises(InputFileError) as caught:
        image_pixels(image, (32, 32))
    assert str(caught.value.issues[0]) == f"{image}: not an image Pillow can read: decoder state lost"
