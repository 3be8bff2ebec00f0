"""``python -m hyper_parallel.data``: ``prepare`` a corpus into token shards, or ``verify`` one.

Exit status: 0 done, 2 an input error (printed as ``FILE:LINE: problem``, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import attrs

from hyper_parallel.data.overlong import OVERLONG

if TYPE_CHECKING:
    from hyper_parallel.data.prepare import RunSettings

__all__ = ["load_run", "main"]

EXIT_INPUT_ERROR = 2
#: Largest ``--shard-mb`` (1 TiB of input per shard): beyond it the shard size is no finite byte count.
MAX_SHARD_MB = 1 << 20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hyper_parallel.data", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser(
        "prepare",
        help="tokenize text into memory-mapped shards with the tokenizer a training config builds",
        description="Tokenize INPUT files (files, folders, globs) into DIR with the config's tokenizer.",
    )
    prepare.add_argument(
        "inputs", nargs="+", metavar="INPUT", help=".jsonl, .txt or .parquet files, folders, globs"
    )
    prepare.add_argument("--output", required=True, metavar="DIR", help="the prepared folder (new or empty)")
    prepare.add_argument(
        "--config-file", required=True, metavar="CONFIG", help="training config: its tokenizer"
    )
    prepare.add_argument(
        "--workers", type=int, default=1, metavar="N", help="tokenizing processes (default 1)"
    )
    prepare.add_argument(
        "--text-field", default="text", metavar="F", help="JSON key or Parquet column of the text"
    )
    prepare.add_argument(
        "--format",
        choices=("jsonl", "text", "parquet", "chat"),
        default=None,
        help="input format (default: by file suffix); chat reads records of OpenAI messages, ShareGPT "
        "conversations or Alpaca instruction/input/output, from .jsonl or Parquet columns",
    )
    prepare.add_argument(
        "--shard-mb", type=float, default=64.0, metavar="MB", help="input megabytes per shard (default 64)"
    )
    prepare.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|FILE",
        help="chat template replacing the config's tokenizer.chat_template: a preset (builtin, chatml, "
        "llama3) or a Jinja file",
    )
    prepare.add_argument(
        "--train-on",
        default="assistant",
        metavar="ROLES",
        help="chat: the roles whose turns carry labels, comma-separated (default assistant)",
    )
    prepare.add_argument(
        "--drop-unlabeled",
        action="store_true",
        help="chat: leave out the records that carry no label (default: refuse them)",
    )
    prepare.add_argument(
        "--overlong",
        choices=OVERLONG,
        default=None,
        help="a conversation longer than the config's training.seq_len: refuse it (error), or say how many "
        "training will drop or cut (default: the config dataset's overlong, else error)",
    )
    verify = commands.add_parser("verify", help="check every file of a prepared folder against its checksums")
    verify.add_argument("folder", metavar="DIR")
    return parser


def load_run(config_file: str, cfg: Any = None) -> RunSettings:
    """What ``prepare`` takes of the training config ``config_file`` (``cfg``: it resolved already): the
    tokenizer its ``tokenizer`` group builds (nothing else of the config is built, so preparing and
    training cannot disagree), its ``training.seq_len`` and its dataset's ``overlong`` policy."""
    from hyper_parallel.config import load_config
    from hyper_parallel.data.prepare import InputError, RunSettings

    cfg = load_config(config_file) if cfg is None else cfg
    try:
        tokenizer = cfg.tokenizer.build(cfg.model.weights_path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_file}: tokenizer: {exc}") from None
    seq_len = getattr(getattr(cfg, "training", None), "seq_len", None)
    dataset = getattr(getattr(cfg, "dataloader", None), "dataset", None)
    return RunSettings(
        tokenizer,
        config_file,
        seq_len if isinstance(seq_len, int) else None,
        getattr(dataset, "overlong", "error"),
    )


def _chat_template(value: str, tokenizer: Any) -> str:
    """The Jinja text ``--chat-template`` names: a file, or a preset as ``tokenizer.chat_template`` reads
    it (the built-in one with the config's ``tokenizer`` group's ``add_bos``)."""
    from hyper_parallel.components.tokenizer.chat_templates import PRESETS, is_template_file
    from hyper_parallel.data.prepare import InputError
    from hyper_parallel.errors import did_you_mean

    template_file = Path(value)
    if template_file.exists():
        return _read_template(template_file)
    if is_template_file(value):
        raise InputError(f"{template_file}: no such file")
    if value not in PRESETS:
        raise InputError(
            f"--chat-template: {value!r} is no preset ({', '.join(PRESETS)}) and no file"
            f"{did_you_mean(value, PRESETS)}"
        )
    return attrs.evolve(tokenizer, chat_template=value).chat_template_text() or ""


def _read_template(path: Path) -> str:
    """The text of an existing ``--chat-template`` file, read as ``tokenizer.chat_template`` reads one
    (``read_template_file``: a regular file of UTF-8 text, at most ``MAX_TEMPLATE_BYTES``), its refusals in
    prepare's words (a binary or a FIFO named by mistake is one line, not a traceback or a wait)."""
    from hyper_parallel._disk import write_problem
    from hyper_parallel.components.tokenizer.chat_templates import read_template_file
    from hyper_parallel.data.prepare import InputError

    try:
        return read_template_file(path)
    except OSError as exc:
        raise InputError(f"--chat-template: {path}: {write_problem(exc)}") from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--chat-template: {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at {exc.start}): a "
            "chat template is a Jinja text file"
        ) from None
    except ValueError as exc:
        raise InputError(f"--chat-template: {path}: {exc}: a chat template is a Jinja text file") from None


def main(argv: Sequence[str] | None = None, *, err: TextIO | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    from hyper_parallel.config import ConfigError, load_config
    from hyper_parallel.data import shards
    from hyper_parallel.data.chat import train_on_problem
    from hyper_parallel.data.prepare import InputError, PrepareOptions, prepare

    err = err if err is not None else sys.stderr
    out = out if out is not None else sys.stdout
    args = _parser().parse_args(argv)
    try:
        if args.command == "verify":
            bad = shards.verify(args.folder)
            for path in bad:
                err.write(f"{path}: its content differs from the manifest's SHA-256\n")
            if not bad:
                out.write(f"{args.folder}: every shard matches the manifest\n")
            return EXIT_INPUT_ERROR if bad else 0
        if args.workers < 1:
            raise InputError(f"--workers: must be at least 1, got {args.workers}")
        if not args.shard_mb > 0:  # also NaN
            raise InputError(f"--shard-mb: must be positive, got {args.shard_mb}")
        if args.shard_mb > MAX_SHARD_MB:
            raise InputError(f"--shard-mb: must be at most {MAX_SHARD_MB} (1 TiB), got {args.shard_mb}")
        template = None
        cfg = None  # the config, resolved once for the template's preset and for prepare
        if args.chat_template is not None:
            if args.format != "chat":
                raise InputError("--chat-template: only read with --format chat")
            cfg = load_config(args.config_file)
            template = _chat_template(args.chat_template, cfg.tokenizer)
        train_on = tuple(role.strip() for role in args.train_on.split(","))
        if args.format != "chat" and (train_on != ("assistant",) or args.drop_unlabeled):
            flag = "--drop-unlabeled" if args.drop_unlabeled else "--train-on"
            raise InputError(f"{flag}: only read with --format chat")
        problem = train_on_problem(train_on)
        if problem is not None:
            raise InputError(f"--train-on: {problem}")
        options = PrepareOptions(
            format=args.format,
            text_field=args.text_field,
            shard_bytes=max(1, int(args.shard_mb * (1 << 20))),
            chat_template=template,
            train_on=train_on,
            drop_unlabeled=args.drop_unlabeled,
        )
        manifest = prepare(
            args.inputs,
            args.output,
            load_run(args.config_file, cfg),
            options=options,
            workers=args.workers,
            stream=err,
            overlong=args.overlong,
            out=out,
        )
    except (InputError, shards.PreparedError, ConfigError) as exc:
        err.write(f"{exc}\n")
        return EXIT_INPUT_ERROR
    except OSError as exc:
        from hyper_parallel._disk import write_problem

        where = exc.filename or getattr(args, "output", None) or getattr(args, "folder", "")
        err.write(f"{where}: {write_problem(exc)}\n")
        return EXIT_INPUT_ERROR
    out.write(
        f"{args.output}: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens in "
        f"{len(manifest['shards'])} shard(s) ({manifest['dtype']})\n"
    )
    if manifest["chat"]:
        share = manifest["label_tokens"] / max(manifest["tokens"], 1)
        dropped = manifest["unlabeled_dropped"]
        out.write(
            f"{args.output}: {manifest['label_tokens']:,} tokens carry labels ({share:.1%} of all)"
            + (f"; {dropped:,} record(s) without one dropped" if dropped else "")
            + "\n"
        )
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
