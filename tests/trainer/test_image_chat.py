"""Vision-language training on real image-text data: the ``image_chat`` source end to end.

A small folder of PNG images (made with Pillow) and a JSON lines file of chat messages that name them train
the Qwen 3.5 VL debug model through the real launcher; the loss falls, only assistant tokens carry labels,
``generate --image`` answers deterministically, and the export refuses a vision-language checkpoint.
Wrong inputs are refused at ``--dry-run`` with the launch's words (``FILE:LINE: problem``, exit 2).
"""

from __future__ import annotations

import io
import json
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from hyper_parallel.launch import main  # noqa: E402
from tests.support.processes import clean_env  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen3_5_vl_debug.yaml"
COLOURS = {"red": (220, 30, 30), "green": (30, 190, 50), "blue": (40, 70, 230), "yellow": (240, 230, 30)}


def conversation(image: str, answer: str) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "Colour?"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ]
    }


def write_data(folder: Path) -> Path:
    """Four 64 x 48 single-colour PNGs in ``folder/pics``, and ``folder/train.jsonl`` asking their colour."""
    (folder / "pics").mkdir(parents=True)
    lines = []
    for name, rgb in COLOURS.items():
        Image.new("RGB", (64, 48), rgb).save(folder / "pics" / f"{name}.png")
        lines.append(json.dumps(conversation(f"pics/{name}.png", name)))
    data = folder / "train.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return data


def flags(data: Path, *extra: str) -> list[str]:
    return [
        "--config-file", str(CONFIG),
        "--dataloader.dataset.source", "image_chat",
        "--dataloader.dataset.paths", f"[{data}]",
        "--dataloader.dataset.image_min_pixels", "1024",
        "--dataloader.dataset.image_max_pixels", "4096",
        "--training.global_batch_size", "4",
        "--training.micro_batch_size", "4",
        "--training.seq_len", "48",
        "--lr_scheduler.warmup_steps", "1",
        *extra,
    ]  # fmt: skip


def run(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Eight steps of the VL debug model on the four conversations, through ``python -m ...train_vl``."""
    tmp = tmp_path_factory.mktemp("image-chat")
    data = write_data(tmp)
    argv = flags(
        data,
        "--training.max_steps", "8",
        "--metrics.log_freq", "1",
        "--metrics.jsonl_path", str(tmp / "metrics.jsonl"),
        "--checkpoint.enable", "true",
        "--checkpoint.folder", str(tmp / "ckpt"),
    )  # fmt: skip
    done = run("hyper_parallel.train_vl", *argv, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"tmp": tmp, "data": data, "metrics": tmp / "metrics.jsonl", "ckpt": tmp / "ckpt"}


@pytest.mark.multiprocess
def test_the_vl_debug_model_learns_from_an_image_folder(trained: dict[str, Path]) -> None:
    losses = [json.loads(line)["loss"] for line in trained["metrics"].read_text().splitlines()]
    assert len(losses) == 8
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.5 * losses[0], losses


def test_only_the_assistant_tokens_carry_labels(tmp_path: Path) -> None:
    from hyper_parallel.components.dataloader import ImageChatSource, LoaderRequest
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.models.qwen3_5 import create_vl_model_spec

    data = write_data(tmp_path)
    args = create_vl_model_spec("debugmodel", overrides={"text.vocab_size": 512, "image_token_id": 259}).args
    tokenizer = ByteTokenizer.Config().build()
    dataset = ImageChatSource(paths=(str(data),), image_min_pixels=1024, image_max_pixels=4096)
    request = LoaderRequest(
        tokenizer, 0, 1, seq_len=48, micro_batch_size=1, seed=0, vision=args.vision, image_token_id=259
    )
    sample = dataset.samples(request, seed=0, max_samples=None)[0]  # the red image
    ids, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
    # 64 x 48 pixels rounded to the 32-pixel blocks: 64 x 64, 2 x 2 merged tokens of 4 x 4 patches
    expected = [tokenizer.bos_id, *b"<|user|>\n", *[259] * 4, *b"Colour?\n", *b"<|assistant|>\n", *b"red"]
    expected += [tokenizer.eos_id]
    assert ids[: len(expected)] == expected
    trained_at = [i for i, label in enumerate(labels) if label != -100]
    assert trained_at == list(range(len(expected) - 4, len(expected)))  # 'red' and the EOS
    assert [ids[i] for i in trained_at] == [*b"red", tokenizer.eos_id]
    assert sample["grid_thw"].tolist() == [[1, 4, 4]]
    assert tuple(sample["pixel_values"].shape) == (16, 3 * 2 * 16 * 16)
    red = sample["pixel_values"].view(16, 3, -1)[:, 0]  # the red channel of every patch, scaled to [-1, 1]
    assert red.sub(220 / 127.5 - 1).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("bounds", "size"),
    [
        ((1024, 4096), (64, 64)),
        ((1024, 1024), (32, 32)),
        ((16384, 65536), (160, 128)),
        ((1024, 3072), (64, 32)),
    ],
)
def test_the_pixel_bounds_set_the_image_size(
    bounds: tuple[int, int], size: tuple[int, int], tmp_path: Path
) -> None:
    """A 64 x 48 image in 32-pixel blocks: kept at 64 x 64 within the bounds, shrunk below the maximum,
    grown to the minimum, its aspect kept; the sample's patch grid and placeholders follow."""
    from hyper_parallel.components.dataloader import ImageChatSource, LoaderRequest
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.models.qwen3_5 import create_vl_model_spec

    low, high = bounds
    data = write_data(tmp_path)
    args = create_vl_model_spec("debugmodel", overrides={"text.vocab_size": 512, "image_token_id": 259}).args
    dataset = ImageChatSource(paths=(str(data),), image_min_pixels=low, image_max_pixels=high)
    request = LoaderRequest(
        ByteTokenizer.Config().build(), 0, 1, seq_len=96, micro_batch_size=1, seed=0, vision=args.vision,
        image_token_id=259,
    )  # fmt: skip
    sample = dataset.samples(request, seed=0, max_samples=1)[0]
    width, height = size
    assert sample["grid_thw"].tolist() == [[1, height // 16, width // 16]]
    assert sample["input_ids"].tolist().count(259) == width * height // 32**2


@pytest.mark.multiprocess
def test_generate_answers_about_an_image_deterministically(trained: dict[str, Path]) -> None:
    argv = [str(trained["ckpt"]), "--image", str(trained["tmp"] / "pics" / "red.png"), "--prompt", "Colour?"]
    first = run("hyper_parallel.generate", *argv, "--max-new-tokens", "6", cwd=trained["tmp"])
    second = run("hyper_parallel.generate", *argv, "--max-new-tokens", "6", cwd=trained["tmp"])
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.startswith("Colour?")
    assert len(first.stdout) > len("Colour?\n")


@pytest.mark.multiprocess
def test_the_export_loads_in_transformers_vision_language_class_with_the_trained_logits(
    trained: dict[str, Path],
) -> None:
    """``export`` writes a ``Qwen3_5ForConditionalGeneration`` folder: transformers loads it and gives our
    checkpoint's logits on text with an image (1e-4, fp32); ``generate --image`` runs from it too."""
    transformers = pytest.importorskip("transformers")
    import torch

    from hyper_parallel.generate import load_model

    out = trained["tmp"] / "hf"
    done = run("hyper_parallel.export", str(trained["ckpt"]), str(out), cwd=trained["tmp"])
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["image_token_id"] == 259
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert (processor["min_pixels"], processor["max_pixels"]) == (1024, 4096)  # the training data's bounds
    assert (processor["image_mean"], processor["image_std"]) == ([0.5] * 3, [0.5] * 3)
    theirs = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_model(trained["ckpt"]).model.float().eval()
    args = ours.args
    merge = args.vision.spatial_merge_size
    grid = torch.tensor([[1, 2 * merge, 3 * merge]])  # 6 merged image tokens
    patch = args.vision.in_channels * args.vision.temporal_patch_size * args.vision.patch_size**2
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(int(grid.prod()), patch, generator=generator)
    ids = torch.tensor([[67, 111, 108] + [259] * 6 + [111, 117, 114, 63]])
    with torch.no_grad():
        expected = theirs(
            input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(ids == 259).int()
        ).logits
        got = ours(ids, pixels, grid, image_token_id=259)
    assert (got - expected).abs().max().item() < 1e-4
    image = str(trained["tmp"] / "pics" / "red.png")
    argv = [str(out), "--image", image, "--prompt", "Colour?", "--max-new-tokens", "6"]
    from_export = run("hyper_parallel.generate", *argv, cwd=trained["tmp"])
    argv[0] = str(trained["ckpt"])
    from_checkpoint = run("hyper_parallel.generate", *argv, cwd=trained["tmp"])
    assert from_export.returncode == 0, from_export.stderr
    assert from_export.stdout == from_checkpoint.stdout  # the same answer from both: same image size


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (no pixel data: it is never decoded)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def _missing_image(tmp: Path) -> tuple[Path, str]:
    data = tmp / "train.jsonl"
    data.write_text(json.dumps(conversation("pics/gone.png", "red")) + "\n")
    return data, f"{data}:1: image {str(tmp / 'pics' / 'gone.png')!r} does not exist"


def _no_messages(tmp: Path) -> tuple[Path, str]:
    data = tmp / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    return data, f"{data}:1: not a JSON object with a 'messages' list"


def _image_in_the_answer(tmp: Path) -> tuple[Path, str]:
    data = tmp / "train.jsonl"
    record = conversation("pics/red.png", "red")
    record["messages"][1]["content"].append({"type": "image", "image": "pics/red.png"})
    data.write_text(json.dumps(record) + "\n")
    return data, f"{data}:1: messages[1]: an assistant turn holds an image; images go in other turns"


def _decompression_bomb(tmp: Path) -> tuple[Path, str]:
    (tmp / "pics").mkdir()
    (tmp / "pics" / "bomb.png").write_bytes(png_header(40_000, 40_000))
    data = tmp / "train.jsonl"
    data.write_text(json.dumps(conversation("pics/bomb.png", "red")) + "\n")
    return data, (
        f"{tmp / 'pics' / 'bomb.png'}: holds more than Pillow's limit of {Image.MAX_IMAGE_PIXELS} pixels "
        "(PIL.Image.MAX_IMAGE_PIXELS): a decompression bomb, or an image to shrink before training"
    )


def _postscript_named_png(tmp: Path) -> tuple[Path, str]:
    (tmp / "pics").mkdir()
    (tmp / "pics" / "red.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 48\nshowpage\n")
    data = tmp / "train.jsonl"
    data.write_text(json.dumps(conversation("pics/red.png", "red")) + "\n")
    return data, f"{tmp / 'pics' / 'red.png'}: not an image in a format read here (PNG, JPEG, WEBP, GIF, BMP)"


def _longer_than_seq_len(tmp: Path) -> tuple[Path, str]:
    data = write_data(tmp)
    record = conversation("pics/red.png", "red " * 20)
    with data.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    return data, (
        f"{data}:5: takes 117 tokens (4 of them for 1 image(s)), more than training.seq_len 48: raise "
        "seq_len, lower dataloader.dataset.image_max_pixels or shorten the conversation"
    )


FAULTS = {
    "missing_image": _missing_image,
    "no_messages": _no_messages,
    "image_in_the_answer": _image_in_the_answer,
    "decompression_bomb": _decompression_bomb,
    "postscript_named_png": _postscript_named_png,
    "longer_than_seq_len": _longer_than_seq_len,
}


def launch(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), prog="train_vl", out=out, err=err)
    return status, err.getvalue()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_bad_image_chat_data_is_refused_at_dry_run_as_at_launch(fault: str, tmp_path: Path) -> None:
    data, message = FAULTS[fault](tmp_path)
    quiet = [
        "--training.max_steps",
        "1",
        "--metrics.log_freq",
        "1",
        "--metrics.jsonl_path",
        str(tmp_path / "m"),
    ]
    dry = launch(*flags(data, *quiet), "--dry-run")
    started = launch(*flags(data, *quiet))
    assert dry == (2, message + "\n")
    assert started == dry
