"""The benchmark: resolve, override, dump and start-up cost of the config layer, and the same work in peers.

Run from the repository root (``pip install -e '.[bench]'`` installs Hydra, OmegaConf and pydantic)::

    python -m bench [--quick] [--json PATH] [--config FILE] [--rounds N]

Warm figures time one call in a process that has already done the work once (imports done, structuring
functions compiled, targets imported): the median over repeated samples, each sample timing a batch of
calls with ``time.perf_counter_ns`` sized to last about a millisecond; the rows' samples are interleaved
round by round, as the cold commands are, so that machine drift hits every row of a ratio alike, and each
sample follows a few untimed calls of its own row (see :data:`WARMUP_CALLS`). Cold
figures time whole fresh ``python`` processes with ``subprocess``; the commands are interleaved round by
round so that machine drift hits all of them alike, and the median per command is reported. A ratio is the
median over rounds of the quotient of the two rows' samples of the same round (a slow spell of a shared
machine lands on both samples and cancels), from figures of one run, so it holds on any machine; absolute
numbers are for this machine only.

Rows:

* ``resolve``: ``resolve_root(raw)`` of the parsed document (16 groups, 2 targets imported once).
* ``overrides(N)``: ``apply_overrides(cfg, N string overrides)``: unstructure, patch, one restructure.
* ``dump`` / ``dump+reload``: ``dump_config(cfg)``, and that plus ``resolve_root(parse_yaml(text)[0])``.
* ``parse (locations)`` vs ``yaml CSafeLoader``: our YAML 1.2 reader with a source map vs plain PyYAML.
* ``hydra`` / ``pydantic``: the same document resolved by the peers in ``bench/peers`` (see their docs for
  where their checks differ from ours), warm, and cold (a process that imports the peer and loads the file).
* cold ``python -c pass``, ``import attrs, cattrs, yaml`` (the floor), and our ``train_lm --dry-run``.
"""

import argparse
import enum
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import yaml

from bench.overrides import generate_overrides
from hyper_parallel.config import apply_overrides, dump_config, resolve_root
from hyper_parallel.config.yaml_load import parse_yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = "configs/qwen3_5_full.yaml"

#: What the config layer must stay within, where a user feels it: a launch's start-up (a ratio of one run,
#: which holds on a shared machine), a resolve and ten overrides in milliseconds (absolute, on this machine),
#: and Hydra, the peer users come from, at least 10x slower: (name, ratio or absolute key, limit, unit).
TARGETS = [
    ("cold dry-run <= 1.6x import floor", "cold dry-run/import floor", 1.6, "x"),
    ("warm resolve < 1 ms", "resolve", 1000.0, "us"),
    ("overrides(10) < 2 ms", "overrides(10)", 2000.0, "us"),
    ("Hydra >= 10x slower (warm)", "ours/hydra", 0.1, "x"),
]


@attrs.define
class Timing:
    """Median and spread of one measured row, in microseconds."""

    name: str
    median_us: float
    p25_us: float
    p75_us: float
    samples: int
    calls_per_sample: int
    kind: str  # "warm" or "cold"
    #: The per-call time of each sample, in the order the rounds ran (for ratios paired by round).
    rounds_us: list[float] = attrs.field(factory=list, repr=False)


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 4:
        med = statistics.median(values)
        return min(values), med, max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def measure_warm(name: str, fn: Callable[[], object], samples: int, min_sample_ns: int = 1_000_000) -> Timing:
    """Median per-call time of ``fn`` after warmup; each sample times a batch lasting ``min_sample_ns``."""
    for _ in range(3):
        fn()
    start = time.perf_counter_ns()
    fn()
    one = max(time.perf_counter_ns() - start, 1)
    batch = max(1, min_sample_ns // one)
    for _ in range(min(batch, 20)):  # warm caches at the batch size too
        fn()
    per_call: list[float] = []
    gc.collect()
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / batch / 1000)
    p25, med, p75 = _quantiles(per_call)
    return Timing(name, med, p25, p75, samples, int(batch), "warm")


#: Untimed calls of a row right before each of its samples. Without them a sample's first calls pay for
#: what the previous row did to the caches: a pydantic sample taken right after the Hydra row ran ~60%
#: slower than one taken after pydantic's own, and since the order alternates every round, the paired
#: ratios alternated between two values (1.5x and 2.4x for ours/pydantic in one run).
WARMUP_CALLS = 3


def measure_warm_rows(
    fns: dict[str, Callable[[], object]], samples: int, min_sample_ns: int = 1_000_000
) -> dict[str, Timing]:
    """:func:`measure_warm` of several rows at once, their samples interleaved round by round (the order
    reversed every other round), so that machine drift hits every row alike, as it does the cold rows:
    each row's batch is sized alone, exactly as :func:`measure_warm` sizes it, and each sample follows
    :data:`WARMUP_CALLS` untimed calls of its own row."""
    batches: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        start = time.perf_counter_ns()
        fn()
        one = max(time.perf_counter_ns() - start, 1)
        batches[name] = batch = max(1, min_sample_ns // one)
        for _ in range(min(batch, 20)):  # warm caches at the batch size too
            fn()
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    gc.collect()
    for r in range(samples):
        order = list(fns.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            batch = batches[name]
            for _ in range(WARMUP_CALLS):  # the row before left the caches in its own state
                fn()
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                fn()
            per_call[name].append((time.perf_counter_ns() - t0) / batch / 1000)
    out = {}
    for name, values in per_call.items():
        p25, med, p75 = _quantiles(values)
        out[name] = Timing(name, med, p25, p75, samples, int(batches[name]), "warm", values)
    return out


def measure_cold(commands: dict[str, list[str]], rounds: int) -> dict[str, Timing]:
    """Wall time of each command in a fresh process, interleaved by round; the first round is discarded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for r in range(rounds + 1):
        order = list(commands.items())
        if r % 2:
            order.reverse()
        for name, argv in order:
            t0 = time.perf_counter_ns()
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
            elapsed = (time.perf_counter_ns() - t0) / 1000
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
            if r:
                times[name].append(elapsed)
    out = {}
    for name, values in times.items():
        p25, med, p75 = _quantiles(values)
        out[name] = Timing(name, med, p25, p75, len(values), 1, "cold", values)
    return out


def paired_ratio(a: Timing, b: Timing) -> float:
    """The median over rounds of ``a``'s sample divided by ``b``'s sample of the same round.

    Both rows were sampled in every round, one right after the other, so a slow spell of a shared machine
    (another job, a throttled core) lands on both samples of a round and cancels in their quotient; the
    quotient of the two medians would instead compare samples from different spells. Falls back to that
    quotient when the rows were not sampled round by round together."""
    if len(a.rounds_us) != len(b.rounds_us) or not a.rounds_us:
        return a.median_us / b.median_us
    return statistics.median(x / y for x, y in zip(a.rounds_us, b.rounds_us, strict=True))


def _plain(value: Any) -> Any:
    """A comparable plain form: attrs and pydantic objects as dicts, tuples as lists, Enums as values."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("_target_", "target")}
    if hasattr(value, "spec") and hasattr(value, "model_dump"):  # the pydantic model group
        return _plain(value.spec)
    if hasattr(value, "model_dump"):
        return _plain({k: getattr(value, k) for k in type(value).model_fields})
    if attrs.has(type(value)):
        return {f.name: _plain(getattr(value, f.name)) for f in attrs.fields(type(value)) if f.eq}
    return value  # functions and classes of a ModelSpec compare by identity


def check_peers(ours: Any, peers: dict[str, Any]) -> list[str]:
    """Names of peers whose resolved config differs from ours (an unfair comparison otherwise)."""
    want = _plain(ours)
    return [name for name, got in peers.items() if _plain(got) != want]


def _fmt_us(us: float) -> str:
    if us >= 100_000:
        return f"{us / 1000:,.0f} ms"
    if us >= 1000:
        return f"{us / 1000:,.2f} ms"
    return f"{us:,.1f} us"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure everything; returns the JSON-ready results."""
    config = args.config
    text = (ROOT / config).read_text(encoding="utf-8")
    raw, _ = parse_yaml(text, config)
    cfg = resolve_root(raw)
    overrides = generate_overrides(cfg, 100)
    if len(overrides) < 100:
        print(f"note: only {len(overrides)} distinct valid overrides could be generated", file=sys.stderr)
    samples = 7 if args.quick else 31
    timings: dict[str, Timing] = {}
    rows: dict[str, Callable[[], object]] = {}

    def warm(name: str, fn: Callable[[], object]) -> None:
        rows[name] = fn  # measured together below, interleaved

    warm("resolve", lambda: resolve_root(raw))
    for n in (1, 10, 100):
        chosen = dict(overrides[:n])
        warm(f"overrides({n})", lambda chosen=chosen: apply_overrides(cfg, chosen))  # type: ignore[misc]
    dumped = dump_config(cfg)
    warm("dump", lambda: dump_config(cfg))
    warm("dump+reload", lambda: resolve_root(parse_yaml(dump_config(cfg))[0]))
    warm("parse (locations)", lambda: parse_yaml(text, config))
    warm("yaml CSafeLoader", lambda: yaml.load(text, Loader=yaml.CSafeLoader))
    assert resolve_root(parse_yaml(dumped)[0]) == cfg, "dump does not reload to an equal config"

    peers_ok: dict[str, bool] = {}
    peer_modules = {}
    if not args.no_peers:
        from bench.peers import hydra_peer, pydantic_peer

        peer_modules = {"hydra": hydra_peer, "pydantic": pydantic_peer}
        resolved = {name: mod.resolve(raw) for name, mod in peer_modules.items()}
        different = check_peers(cfg, resolved)
        peers_ok = {name: name not in different for name in peer_modules}
        for name in different:
            print(f"WARNING: the {name} peer resolves to a different config", file=sys.stderr)
        for name, mod in peer_modules.items():
            warm(name, lambda mod=mod: mod.resolve(raw))  # type: ignore[misc]
    print(f"warm (median per call, {samples} interleaved samples):", file=sys.stderr)
    for name, timing in measure_warm_rows(rows, samples).items():
        timings[name] = timing
        print(f"  {name:<28} {_fmt_us(timing.median_us):>12}", file=sys.stderr)

    py = sys.executable
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "import floor": [py, "-c", "import attrs, cattrs, yaml"],
        # the shipped config names placeholder files: the config layer's start-up, without their checks
        "dry-run": [
            py,
            "-m",
            "hyper_parallel.train_lm",
            "--config-file",
            config,
            "--dry-run",
            "--no-file-checks",
        ],
        "ours load_config": [py, "-m", "bench.peers.ours", config],
    }
    for name in peer_modules:
        commands[f"{name} load"] = [py, "-m", f"bench.peers.{name}_peer", config]
    rounds = args.rounds or (3 if args.quick else 15)
    print(f"cold (median of {rounds} interleaved rounds):", file=sys.stderr)
    for name, timing in measure_cold(commands, rounds).items():
        timings[f"cold {name}"] = timing
        print(f"  {name:<28} {_fmt_us(timing.median_us):>12}", file=sys.stderr)

    med = {name: t.median_us for name, t in timings.items()}

    def ratio(a: str, b: str) -> float:
        return paired_ratio(timings[a], timings[b])

    ratios = {
        "overrides(1)/resolve": ratio("overrides(1)", "resolve"),
        "overrides(10)/resolve": ratio("overrides(10)", "resolve"),
        "overrides(100)/resolve": ratio("overrides(100)", "resolve"),
        "dump/resolve": ratio("dump", "resolve"),
        "dump+reload/resolve": ratio("dump+reload", "resolve"),
        "parse (locations)/CSafeLoader": ratio("parse (locations)", "yaml CSafeLoader"),
        "cold dry-run/import floor": ratio("cold dry-run", "cold import floor"),
        "cold dry-run/python": ratio("cold dry-run", "cold python -c pass"),
        "cold load_config/import floor": ratio("cold ours load_config", "cold import floor"),
    }
    for name in peer_modules:
        ratios[f"ours/{name}"] = ratio("resolve", name)
        ratios[f"cold ours/{name}"] = ratio("cold ours load_config", f"cold {name} load")
    checks = []
    for label, key, limit, unit in TARGETS:
        value = med.get(key) if unit == "us" else ratios.get(key)
        if value is None:
            checks.append({"target": label, "value": None, "limit": limit, "passed": None})
            continue
        checks.append(
            {"target": label, "value": value, "limit": limit, "passed": value <= limit, "unit": unit}
        )
    return {
        "config": config,
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "overrides": [k for k, _ in overrides],
        "peers_equivalent": peers_ok,
        "timings": {name: attrs.asdict(t) for name, t in timings.items()},
        "ratios": ratios,
        "targets": checks,
    }


def render(results: dict[str, Any]) -> str:
    """The table printed at the end of a run (Markdown, so it can be pasted into the README)."""
    lines = [
        f"config: {results['config']}; Python {results['machine']['python']}, "
        f"{results['machine']['cpus']} CPUs{' (quick run)' if results['quick'] else ''}",
        "",
        "| measurement | median | p25 - p75 | samples x calls |",
        "| --- | ---: | ---: | ---: |",
    ]
    for t in results["timings"].values():
        lines.append(
            f"| {t['kind']} {t['name'].removeprefix('cold ')} | {_fmt_us(t['median_us'])} | "
            f"{_fmt_us(t['p25_us'])} - {_fmt_us(t['p75_us'])} | {t['samples']} x {t['calls_per_sample']} |"
        )
    lines += ["", "| ratio (same run) | value |", "| --- | ---: |"]
    for name, value in results["ratios"].items():
        lines.append(f"| {name} | {value:.2f}x |" if value >= 0.1 else f"| {name} | {value:.4f}x |")
    lines += ["", "| target | measured | limit | result |", "| --- | ---: | ---: | --- |"]
    for c in results["targets"]:
        if c["value"] is None:
            lines.append(f"| {c['target']} | n/a | {c['limit']} | SKIPPED |")
            continue
        unit = " us" if c.get("unit") == "us" else "x"
        shown = f"{c['value']:.2f}" if c["value"] >= 0.1 else f"{c['value']:.4f}"
        lines.append(
            f"| {c['target']} | {shown}{unit} | {c['limit']:g}{unit} | {'PASS' if c['passed'] else 'FAIL'} |"
        )
    if results["peers_equivalent"]:
        same = ", ".join(
            f"{k}: {'same config' if v else 'DIFFERENT'}" for k, v in results["peers_equivalent"].items()
        )
        lines += ["", f"peer results compared with ours: {same}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few samples and rounds: a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    parser.add_argument("--rounds", type=int, default=0, help="cold rounds (default 15, --quick 3)")
    parser.add_argument("--no-peers", action="store_true", help="skip Hydra and pydantic")
    args = parser.parse_args(argv)
    results = run(args)
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0
