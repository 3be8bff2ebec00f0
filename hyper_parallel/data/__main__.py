"""``python -m hyper_parallel.data``: ``prepare`` a corpus into token shards, or ``verify`` one.

Exit status: 0 done, 2 an input error (printed as ``FILE:LINE: problem``, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

__all__ = ["main"]

EXIT_INPUT_ERROR = 2
#: Largest ``--shard-mb`` (1 TiB of input per shard): beyond it the shard size is no finite byte count.
MAX_SHARD_MB = 1 << 20
#: Largest ``--chat-template`` file read (templates are a few KiB; the largest shipped ones about 10).
MAX_TEMPLATE_BYTES = 1 << 20


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
        help="input format (default: by file suffix); chat reads {'messages': [{'role', 'content'}, ...]} "
        "records from .jsonl, or a Parquet messages column",
    )
    prepare.add_argument(
        "--shard-mb", type=float, default=64.0, metavar="MB", help="input megabytes per shard (default 64)"
    )
    prepare.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="Jinja chat template replacing the tokenizer's own",
    )
    verify = commands.add_parser("verify", help="check every file of a prepared folder against its checksums")
    verify.add_argument("folder", metavar="DIR")
    return parser


def _read_template(path: Path) -> str:
    """The text of a ``--chat-template`` file: a regular file of UTF-8 text, at most
    :data:`MAX_TEMPLATE_BYTES` (a binary or a FIFO named by mistake is one line, not a traceback or a wait).
    """
    from hyper_parallel._disk import write_problem
    from hyper_parallel._paths import read_regular
    from hyper_parallel.data.prepare import InputError

    if not path.exists():
        raise InputError(f"{path}: no such file")
    try:
        data = read_regular(path, MAX_TEMPLATE_BYTES)
        return data.decode("utf-8")
    except OSError as exc:
        raise InputError(f"--chat-template: {path}: {write_problem(exc)}") from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--chat-template: {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at {exc.start}): a "
            "chat template is a Jinja text file"
        ) from None
    except ValueError as exc:
        raise InputError(f"--chat-template: {path}: {exc}: a chat template is a Jinja text file") from None


def main(argv: Sequence[str] | None = None, *, err: TextIO | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    from hyper_parallel.config import ConfigError
    from hyper_parallel.data import shards
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
        if args.chat_template is not None:
            if args.format != "chat":
                raise InputError("--chat-template: only read with --format chat")
            template = _read_template(Path(args.chat_template))
        options = PrepareOptions(
            format=args.format,
            text_field=args.text_field,
            shard_bytes=max(1, int(args.shard_mb * (1 << 20))),
            chat_template=template,
        )
        manifest = prepare(
            args.inputs, args.output, args.config_file, options=options, workers=args.workers, stream=err
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
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
