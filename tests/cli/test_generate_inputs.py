"""``generate``'s inputs as data: option values, image bounds from files, the prompt's length before pixels.

Each bad value is one line and exit 2 before anything is loaded (no checkpoint is needed to see it); an
exported folder's ``preprocessor_config.json`` cannot set pixel bounds beyond the image processor's; and an
image whose tokens exceed the model's positions is refused from its header, before a pixel is decoded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from hyper_parallel.config import ConfigError, load_config  # noqa: E402
from hyper_parallel.generate import GenerateError, Loaded, _pixel_bounds, generate_text, main  # noqa: E402
from hyper_parallel.models.qwen3_5 import images  # noqa: E402

VL_DEBUG = Path(__file__).resolve().parents[2] / "configs" / "qwen3_5_vl_debug.yaml"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "meta"], "--device: 'meta' holds no values to decode with; use cpu or an accelerator"),
        (["--temperature", "1e-45"], "--temperature: must be 0 (greedy) or in [0.001, inf), got 1e-45"),
        (["--temperature", "inf"], "--temperature: must be 0 (greedy) or in [0.001, inf), got inf"),
        (["--temperature", "nan"], "--temperature: must be >= 0, got nan"),
        (["--prompt", "caf\udce9"], "--prompt: not UTF-8 text: byte 0xe9 at 3"),  # argv b"caf\xe9"
    ],
)
def test_option_values_torch_cannot_use_are_one_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path, capsys: Any
) -> None:
    argv = [str(tmp_path), "--prompt", "hi", *flags]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"generate: {message}\n")


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
def test_a_history_file_that_fails_when_read_is_one_line_and_exit_2(tmp_path: Path, capsys: Any) -> None:
    # /proc/self/mem is a regular file whose first page is unmapped: reading it fails with EIO
    argv = [str(tmp_path), "--prompt", "hi", "--chat", "--history", "/proc/self/mem"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "generate: /proc/self/mem: cannot be read (Input/output error)\n",
    )


@pytest.mark.parametrize(
    ("low", "high"), [(1024, 2**40), (2**40, 2**40), (images.MAX_PIXELS + 1, images.MAX_PIXELS + 1)]
)
def test_pixel_bounds_of_an_export_are_capped(tmp_path: Path, low: int, high: int) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": low, "max_pixels": high}))
    with pytest.raises(GenerateError) as caught:
        _pixel_bounds(tmp_path)
    assert str(caught.value) == (
        f"{str(tmp_path / 'preprocessor_config.json')!r}: min_pixels {low} and max_pixels {high} are not "
        f"integers with 0 < min <= max <= {images.MAX_PIXELS} (the image processor's largest bound)"
    )
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 1024, "max_pixels": 4096}))
    assert _pixel_bounds(tmp_path) == (1024, 4096)


def test_pixel_bounds_of_a_runs_config_are_capped(tmp_path: Path) -> None:
    """A checkpoint's ``config.yaml`` is a file too: its data's bounds are capped at resolve."""
    config = tmp_path / "config.yaml"
    text = VL_DEBUG.read_text(encoding="utf-8")
    shapes = "    source: shapes "
    assert shapes in text
    data = "    source: image_chat\n    paths: [data.jsonl]\n    image_min_pixels: 1099511627776\n    #"
    config.write_text(text.replace(shapes, data))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "dataloader.dataset.image_min_pixels: must be <= 16777216, got 1099511627776" in str(caught.value)


def test_an_image_past_the_models_positions_is_refused_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 64 x 48 image resized up to the largest bounds takes 16,384 image tokens, more than the VL debug
    model's 4,096 positions: refused from the header, with no pixel decoded (the audit saw 7.2 GB before)."""
    cfg = load_config(VL_DEBUG)
    model = cfg.model.build_model_fn(cfg.model.args, device="meta")
    tokenizer = cfg.tokenizer.build(cfg.model.weights_path)
    bounds = (images.MAX_PIXELS, images.MAX_PIXELS)
    loaded = Loaded(model, tokenizer, cfg.model.args.max_sequence_length(), "vl", image_pixels=bounds)
    image = tmp_path / "red.png"
    Image.new("RGB", (64, 48), (220, 30, 30)).save(image)

    def decoded(*args: object) -> None:
        raise AssertionError("the image was decoded")

    monkeypatch.setattr(images, "image_pixels", decoded)
    with pytest.raises(GenerateError) as caught:
        generate_text(loaded, "Colour?", image=str(image), max_new_tokens=8)
    assert str(caught.value) == (
        "--max-new-tokens: the prompt's 16460 tokens and 8 new ones exceed the model's 4096 positions"
    )
