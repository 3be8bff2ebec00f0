"""``python -m bench data``: prepared data's memory, start-up, prepare throughput and loader share of a step.

Three measurements, on the Llama 3 debug config (byte tokenizer, as shipped):

(a) Flat in the corpus size: a 2-step run on prepared folders of about 1 MB, 64 MB and 1 GB of token ids
    (written directly in the shard format: random bytes cut into documents), each in a fresh process: its
    peak RSS and the CPU seconds from process start to the first step (start-up), and the CPU seconds of
    building the data loader alone. Targets: RSS within 64 MiB and start-up within 3 s from the smallest to
    the largest.
(b) Prepare throughput: ``python -m hyper_parallel.data prepare`` on a JSON-lines corpus of the standard
    library's docstrings (repeated to ``--prepare-mb``) with 1 and 2 workers, as a ratio to the
    tokenizer's own ``encode_batch`` on the same texts in one process (one core: ``RAYON_NUM_THREADS=1``),
    for a byte-level BPE trained here with ``tokenizers`` (the reference) and for the byte tokenizer.
    Target: at least 0.8 x workers (on a machine with that many idle cores: the load average is printed).
(c) Loader share: the time a training step spends waiting for its batches (``next`` on the loader)
    over the step's time, on a prepared corpus, after warm-up steps. Target: at most 1%.

    python -m bench data [--sizes-mb 1,64,1024] [--prepare-mb 32] [--steps 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "llama3_debug.yaml"
_QUIET = {
    "metrics.enable_jsonl": "false",
    "~metrics.jsonl_path": None,  # the config's path: an option of a sink that is off is refused
    "metrics.log_freq": "1000000",
    "checkpoint.enable": "false",
    "validator.enable": "false",
}

# One 2-step run in a fresh process: prints {"rss_mib", "startup_cpu", "loader_cpu"} as JSON.
_RUN = """
import io, json, resource, sys, time
from hyper_parallel.config import load_config
from hyper_parallel.trainer import LLMTrainer
import hyper_parallel.components.dataloader as dl

cfg = load_config(sys.argv[1], json.loads(sys.argv[2]))
spent = {}
build = type(cfg.dataloader).build
def timed(self, request):
    start = time.process_time()
    try:
        return build(self, request)
    finally:
        spent["loader_cpu"] = time.process_time() - start
type(cfg.dataloader).build = timed
trainer = LLMTrainer(cfg, stream=io.StringIO())
startup = time.process_time()
trainer.train()
trainer.close()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"rss_mib": rss, "startup_cpu": startup, **spent}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def write_synthetic_corpus(folder: Path, token_bytes: int, *, seed: int = 0) -> dict[str, Any]:
    """A prepared folder of ``token_bytes`` bytes of uint16 ids for the byte tokenizer (documents ~2 KiB)."""
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.data import shards

    tokenizer = ByteTokenizer.Config().build()
    fingerprint, description = shards.tokenizer_fingerprint(tokenizer)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    total = token_bytes // 2
    per_shard = 32 << 20  # tokens (64 MB) per shard
    entries = []
    for index, start in enumerate(range(0, total, per_shard)):
        count = min(per_shard, total - start)
        tokens = rng.integers(0, 256, size=count, dtype=np.uint16)
        ends = np.arange(2047, count, 2048, dtype=np.int64)
        tokens[ends] = tokenizer.eos_id
        offsets = np.concatenate([[0], ends + 1, [count] if count % 2048 else []]).astype(np.int64)
        arrays = shards.ShardArrays(tokens, offsets, np.zeros(offsets.size - 1, dtype=np.uint8))
        entries.append(shards.write_shard(folder, shards.shard_name(index), arrays))
    manifest = {
        "format": shards.FORMAT,
        "version": shards.FORMAT_VERSION,
        "tokenizer": {"fingerprint": fingerprint, "description": description},
        "dtype": "uint16",
        "input_format": None,
        "text_field": "text",
        "chat": False,
        "chat_template_sha256": None,
        "inputs": [],
        "shards": entries,
        "documents": sum(e["documents"] for e in entries),
        "tokens": sum(e["tokens"] for e in entries),
    }
    shards.write_manifest(folder, manifest)
    return manifest


def _overrides(folder: Path, steps: int) -> dict[str, str]:
    return {
        **_QUIET,
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": json.dumps([str(folder)]),
        "training.max_steps": str(steps),
    }


def measure_flat(work: Path, sizes_mb: list[float]) -> list[dict[str, Any]]:
    """(a): peak RSS, start-up CPU and loader-build CPU of a 2-step run per corpus size."""
    rows = []
    for size in sizes_mb:
        folder = work / f"corpus-{size:g}mb"
        write_synthetic_corpus(folder, int(size * (1 << 20)))
        run = subprocess.run(
            [sys.executable, "-c", _RUN, str(CONFIG), json.dumps(_overrides(folder, 2))],
            env=_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise SystemExit(f"the {size:g} MB run failed:\n{run.stderr}")
        rows.append({"token_mb": size, **json.loads(run.stdout.strip().splitlines()[-1])})
        shutil.rmtree(folder)
    return rows


def _stdlib_corpus(path: Path, megabytes: float) -> float:
    """Write the docstrings corpus as JSON lines to ``path`` (repeated to ``megabytes``); its text MB."""
    from hyper_parallel.components.dataloader import PythonDocsSource

    docs = list(PythonDocsSource().documents())
    size = text = 0
    with path.open("w", encoding="utf-8") as handle:
        while size < megabytes * (1 << 20):
            for doc in docs:
                line = json.dumps({"text": doc}) + "\n"
                handle.write(line)
                size += len(line.encode("utf-8"))
                text += len(doc.encode("utf-8"))
    return text / 1e6


def train_bpe(folder: Path, vocab_size: int = 8192) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on the docstrings corpus (the reference of (b))."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from hyper_parallel.components.dataloader import PythonDocsSource

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(PythonDocsSource().documents(), trainer)
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(specials))
    config = folder / "config.yaml"
    config.write_text(
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        f"tokenizer:\n  _target_: hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config\n"
        f"  path: {json.dumps(str(folder))}\n"
    )
    return config


# The reference: the tokenizer's own encode_batch over the corpus in batches of 1024 documents, in a fresh
# process on one core, reading every encoding's ids; the JSON is parsed before the clock starts.
_ENCODE = """
import json, sys, time
texts = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
if sys.argv[1] == "byte":
    from hyper_parallel.components.tokenizer import ByteTokenizer
    encode = ByteTokenizer.Config().build().encode_batch
    ids = lambda encoded: encoded
else:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    encode = lambda batch: tok.encode_batch(batch, add_special_tokens=False)
    ids = lambda encoded: encoded.ids
start, cpu = time.perf_counter(), time.process_time()
tokens = 0
for i in range(0, len(texts), 1024):
    for encoded in encode(texts[i : i + 1024]):
        tokens += len(ids(encoded))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "tokens": tokens}))
"""


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_prepare(work: Path, megabytes: float) -> dict[str, Any]:
    """(b): prepare MB/s with 1 and 2 workers against ``encode_batch`` MB/s on one core, per tokenizer.

    Two tokenizers: a byte-level BPE trained here with ``tokenizers`` (the reference: a real
    ``encode_batch``) and the byte tokenizer of the debug configs (whose encoding is nearly free, so the
    ratio shows prepare's own costs: reading, JSON, writing). Each figure is one run, in a fresh process,
    ``RAYON_NUM_THREADS=1``; the CPU ratios (CPU seconds of the reference over prepare's, workers
    included) show what the machine's other load does to the wall-clock ones.
    """
    data = work / "stdlib.jsonl"
    text_mb = _stdlib_corpus(data, megabytes)
    configs = {"bpe": train_bpe(work / "bpe"), "byte": CONFIG}
    references = {"bpe": str(work / "bpe" / "tokenizer.json"), "byte": "byte"}
    out: dict[str, Any] = {"text_mb": text_mb, "load_before": os.getloadavg()}
    for name, config in configs.items():
        run = subprocess.run(
            [sys.executable, "-c", _ENCODE, references[name], str(data)],
            env=_env(RAYON_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise SystemExit(f"the encode_batch reference failed:\n{run.stderr}")
        reference = json.loads(run.stdout)
        row: dict[str, Any] = {
            "encode_batch_mb_s": text_mb / reference["seconds"],
            "encode_batch_cpu_s": reference["cpu"],
        }
        for workers in (1, 2):
            folder = work / f"prepared-{name}-{workers}"
            start, cpu = time.perf_counter(), _children_cpu()
            run = subprocess.run(
                [sys.executable, "-m", "hyper_parallel.data", "prepare", str(data), "--output", str(folder),
                 "--config-file", str(config), "--workers", str(workers), "--shard-mb", "2"],
                env=_env(RAYON_NUM_THREADS="1"),
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
            seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
            if run.returncode != 0:
                raise SystemExit(f"prepare failed:\n{run.stderr}")
            row[f"prepare_{workers}_mb_s"] = text_mb / seconds
            row[f"prepare_{workers}_cpu_s"] = cpu
            row[f"ratio_{workers}"] = text_mb / seconds / row["encode_batch_mb_s"]
            row[f"cpu_ratio_{workers}"] = reference["cpu"] / cpu
        out[name] = row
    out["load_after"] = os.getloadavg()
    return out


def measure_loader_share(work: Path, steps: int) -> dict[str, Any]:
    """(c): seconds waiting for batches over seconds per step, after 2 warm-up steps."""
    import io

    from hyper_parallel.config import load_config
    from hyper_parallel.trainer import LLMTrainer

    folder = work / "prepared-byte-1"
    if not folder.is_dir():
        raise SystemExit("the loader measurement needs the prepared corpus of the prepare measurement")
    cfg = load_config(CONFIG, _overrides(folder, steps))

    class Timed(LLMTrainer):
        waits: list[float] = []
        marks: list[float] = []

        def _next_micro_batches(self) -> Any:
            self.marks.append(time.perf_counter())
            start = time.perf_counter()
            batches = super()._next_micro_batches()
            self.waits.append(time.perf_counter() - start)
            return batches

    trainer = Timed(cfg, stream=io.StringIO())
    trainer.train()
    trainer.marks.append(time.perf_counter())
    trainer.close()
    warm = 2
    step_time = (trainer.marks[-1] - trainer.marks[warm]) / (len(trainer.marks) - 1 - warm)
    wait = sum(trainer.waits[warm:]) / len(trainer.waits[warm:])
    return {"step_s": step_time, "loader_s": wait, "share": wait / step_time}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench data", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,64,1024", help="prepared token megabytes of (a)")
    parser.add_argument("--prepare-mb", type=float, default=32.0, help="JSON-lines megabytes of (b)")
    parser.add_argument("--steps", type=int, default=12, help="training steps of (c)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        flat = measure_flat(work, sizes)
        print("(a) 2-step run on prepared tokens (fresh process each)")
        for row in flat:
            print(
                f"    {row['token_mb']:>7g} MB: peak RSS {row['rss_mib']:7.1f} MiB  start-up CPU "
                f"{row['startup_cpu']:5.2f} s  (data loader build {row['loader_cpu'] * 1000:6.1f} ms)"
            )
        rss = flat[-1]["rss_mib"] - flat[0]["rss_mib"]
        startup = flat[-1]["startup_cpu"] - flat[0]["startup_cpu"]
        span = f"{flat[0]['token_mb']:g} MB -> {flat[-1]['token_mb']:g} MB"
        print(
            f"    {span}: RSS {rss:+.1f} MiB (target within 64), start-up {startup:+.2f} s (target within 3)"
        )
        prep = measure_prepare(work, args.prepare_mb)
        load = ", ".join(f"{x:.2f}" for x in prep["load_before"])
        print(f"(b) prepare {prep['text_mb']:.1f} MB of text, one run each (load average before: {load})")
        for name, label in (("bpe", "byte-level BPE (tokenizers)"), ("byte", "byte tokenizer")):
            row = prep[name]
            print(
                f"    {label}: encode_batch on one core {row['encode_batch_mb_s']:.2f} MB/s "
                f"({row['encode_batch_cpu_s']:.1f} CPU s)"
            )
            for workers in (1, 2):
                print(
                    f"      {workers} worker(s): {row[f'prepare_{workers}_mb_s']:.2f} MB/s = "
                    f"{row[f'ratio_{workers}']:.2f} x encode_batch (target >= {0.8 * workers:.1f}); "
                    f"CPU {row[f'prepare_{workers}_cpu_s']:.1f} s = {row[f'cpu_ratio_{workers}']:.2f} x"
                )
        load = ", ".join(f"{x:.2f}" for x in prep["load_after"])
        print(f"    load average after: {load}")
        share = measure_loader_share(work, args.steps)
        print(
            f"(c) loader wait {share['loader_s'] * 1000:.2f} ms of a {share['step_s'] * 1000:.1f} ms step = "
            f"{100 * share['share']:.2f}% (target <= 1%)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"flat": flat, "prepare": prep, "loader": share}, indent=1) + "\n"
        )
    return 0
