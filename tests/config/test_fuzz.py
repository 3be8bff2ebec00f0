"""Property tests: whatever the input, the public API gives a TrainerConfig or a ConfigError, quickly.

Profiles (``HYPOTHESIS_PROFILE``): ``default`` tries 2,000+ inputs in all in well under a minute;
``deep`` tries 50x as many per property (see SECURITY.md). ``NOT_CONFIG`` records any other exception.
"""

import io
import math
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyper_parallel.config import ConfigError, apply_overrides, dump_config, load_config, resolve_root
from hyper_parallel.config.targets import ALLOWED_TARGETS_ENV
from hyper_parallel.config.yaml_load import MAX_CHARS, MAX_NODES, parse_yaml
from hyper_parallel.launch import main
from hyper_parallel.trainer.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted((ROOT / "configs").glob("*.yaml"))
SHIPPED = {p.name: yaml.safe_load(p.read_text()) for p in CONFIG_FILES}
BASE = load_config(ROOT / "configs" / "qwen3_5.yaml")

settings.register_profile(
    "default", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("deep", max_examples=15_000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Wall-clock bound per input: a hang is a failure, not a slow pass.
PER_INPUT = 2.0


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ALLOWED_TARGETS_ENV, "RANK", "WORLD_SIZE", UNSET):
        monkeypatch.delenv(name, raising=False)


def check_result(result: object) -> None:
    assert isinstance(result, TrainerConfig)
    # A config that resolves must dump and reload to an equal config.
    assert resolve_root(yaml.safe_load(dump_config(result))) == result


def outcome(fn: Any, *args: Any, **kwargs: Any) -> object:
    """Call ``fn``: a TrainerConfig passes the round trip, a ConfigError passes; anything else fails."""
    import time

    start = time.process_time()
    try:
        result = fn(*args, **kwargs)
    except ConfigError as exc:
        result = exc
        assert result.issues
    else:
        check_result(result)
    assert time.process_time() - start < PER_INPUT
    return result


# -- random YAML documents ---------------------------------------------------------------------------------

NAMES = [
    "model", "optimizer", "training", "parallelism", "loss", "lr", "_target_", "flavor", "tp", "max_steps",
    "weights_path", "seed", "allowed_targets", "overrides", "x",
]  # fmt: skip
TARGETS = [
    "hyper_parallel.models.qwen3_5.create_model_spec",
    "hyper_parallel.components.optimizer.AdamW.Config",
    "hyper_parallel.components.optimizer.SGD.Config",
    "hyper_parallel.trainer.config.TrainingConfig",
    "hyper_parallel.trainer.config.ParallelismConfig",
    "hyper_parallel.components.loss.CausalLMLoss.Config",
    "os.system",
    "builtins.eval",
    "hyper_parallel.launch.os.system",
    "hyper_parallel.config.targets.load_target",
    "hyper_parallel.components.optimizer",
    "hyper_parallel.__init__",
    "a..b",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(TARGETS + NAMES + ["0.8B", "2B", "mean", "cosine", "1e-4", "yes", "~", "-1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8), inner, max_size=5),
    ),
    max_leaves=20,
)
documents = st.one_of(
    st.dictionaries(st.sampled_from(NAMES), values, max_size=6),
    values,
)

YAML_PIECES = [
    "model:", "  _target_: ", "optimizer:", "  lr: ", "&a ", "*a", "!!python/object/apply:os.system ",
    "!!str ", "!!int ", "!!binary ", "!custom ", "[", "]", "{", "}", ", ", ": ", "- ", "? ", "\n", "  ",
    "---\n", "...\n", "'", '"', "#", "|", ">", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "<<: ", ".nan", ".inf",
    "0x1F", "0o17", "1e400", "99999999999999999999", "\t", "\x00", "\ufeff", "\u2028", "null", "~", "true",
]  # fmt: skip
yaml_texts = st.one_of(
    st.lists(st.sampled_from(YAML_PIECES + TARGETS + NAMES), max_size=30).map("".join),
    st.text(max_size=200),
    st.binary(max_size=200),
)

_TMP = Path(tempfile.mkdtemp(prefix="hp-fuzz-"))


@given(documents)
def test_random_documents_resolve_or_fail_cleanly(raw: object) -> None:
    outcome(resolve_root, raw)


@given(documents)
def test_random_documents_as_files_load_or_fail_cleanly(raw: object) -> None:
    try:
        text = yaml.safe_dump(raw)
    except (yaml.YAMLError, ValueError, OverflowError):
        return
    path = _TMP / "doc.yaml"
    path.write_text(text, encoding="utf-8")
    outcome(load_config, path)


@given(yaml_texts)
def test_random_yaml_text_loads_or_fails_cleanly(text: str | bytes) -> None:
    path = _TMP / "text.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    outcome(load_config, path)


# -- random alias bombs: refused exactly when what they expand to passes a budget ---------------------------

#: Never set, so ``${env:UNSET,DEFAULT}`` reads its default.
UNSET = "HP_TEST_FUZZ_UNSET"
#: How a leaf of ``n`` characters is written, and how many characters it reads back as.
LEAF_STYLES = {
    "plain": (lambda n: "a" * n if n else "a", lambda n: max(n, 1)),
    "quoted": (lambda n: '"' + "a" * n + '"', lambda n: n),
    "!!str": (lambda n: "!!str " + "a" * n if n else '!!str ""', lambda n: n),
    "env-default": (lambda n: f"${{env:{UNSET},{'a' * n}}}" if n else f"'${{env:{UNSET},}}'", lambda n: n),
    "dollar-brace": (lambda n: "$${" + "a" * n, lambda n: n + 2),
}


@st.composite
def alias_bombs(draw: st.DrawFn) -> tuple[str, int, int]:
    """A document ``l0: &l0 LEAF``, ``lI: &lI [*l(I-1), ...]`` (or a mapping ``{kJ: *l(I-1)}``), with the
    number of nodes and of characters it expands to."""
    size = draw(st.sampled_from([0, 1, 50, 10_000, 300_000, 1_300_000]) | st.integers(0, 1_500_000))
    write, read = LEAF_STYLES[draw(st.sampled_from(sorted(LEAF_STYLES)))]
    levels, fan = draw(st.integers(1, 8)), draw(st.integers(1, 30))
    mapping = draw(st.booleans())
    lines = [f"l0: &l0 {write(size)}"]
    nodes, chars = 1, read(size)  # of the level just written
    total_nodes, total_chars = 1 + 1 + nodes, len("l0") + chars  # the root mapping, key l0 and its value
    for level in range(1, levels + 1):
        if mapping:
            body = ", ".join(f"k{j}: *l{level - 1}" for j in range(fan))
            lines.append(f"l{level}: &l{level} {{{body}}}")
            nodes, chars = 1 + fan * (1 + nodes), fan * chars + sum(len(f"k{j}") for j in range(fan))
        else:
            lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * fan) + "]")
            nodes, chars = 1 + fan * nodes, fan * chars
        total_nodes += 1 + nodes
        total_chars += len(f"l{level}") + chars
    return "\n".join(lines) + "\n", total_nodes, total_chars


@settings(max_examples=max(1, settings().max_examples // 3))
@given(alias_bombs())
def test_random_alias_bombs_are_refused_exactly_when_they_pass_a_budget(bomb: tuple[str, int, int]) -> None:
    import time

    text, nodes, chars = bomb
    start = time.process_time()
    if nodes <= MAX_NODES and chars <= MAX_CHARS:
        parse_yaml(text, "bomb.yaml")
    else:
        with pytest.raises(ConfigError) as info:
            parse_yaml(text, "bomb.yaml")
        (issue,) = info.value.issues
        passed = {  # each refusal, and whether the document really passes that budget
            f"document expands to more than {MAX_NODES} nodes (MAX_NODES); check its aliases": nodes
            > MAX_NODES,
            f"document expands to more than {MAX_CHARS} characters of text (MAX_CHARS); check its aliases": (
                chars > MAX_CHARS
            ),
        }
        assert passed.get(issue.message) is True, issue
        assert issue.location is not None
        assert issue.location.startswith("bomb.yaml:")
    assert time.process_time() - start < PER_INPUT


# -- random mutations of every shipped config --------------------------------------------------------------


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def mutate(doc: Any, rng: random.Random, replacement: Any, count: int) -> Any:
    import copy

    doc = copy.deepcopy(doc)
    for _ in range(count):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent, last = _get(doc, path[:-1]), path[-1]
        op = rng.randrange(7)
        if op == 0:  # replace the value
            parent[last] = replacement
        elif op == 1 and isinstance(parent, dict):  # delete the key
            del parent[last]
        elif op == 2 and isinstance(parent, dict):  # rename the key
            parent[rng.choice(NAMES) + rng.choice(["", "s", "_"])] = parent.pop(last)
        elif op == 3:  # swap the type
            value = parent[last]
            parent[last] = (
                str(value) if not isinstance(value, str) else [value]
                if rng.random() < 0.5 else {"x": value}
            )  # fmt: skip
        elif op == 4 and isinstance(parent, dict):  # change a _target_
            group = _get(doc, path[:1])
            if isinstance(group, dict):
                group["_target_"] = rng.choice(TARGETS)
        elif op == 5 and isinstance(parent[last], (int, float)) and not isinstance(parent[last], bool):
            parent[last] = rng.choice([0, -1, 1, 2**63, -(2**63) - 1, 1e308, math.inf, math.nan, 0.5])
        elif op == 6 and isinstance(parent, list):
            parent.append(replacement)
    return doc


@given(st.sampled_from(sorted(SHIPPED)), st.randoms(use_true_random=False), scalars, st.integers(1, 4))
def test_mutated_shipped_configs_resolve_or_fail_cleanly(
    name: str, rng: random.Random, replacement: Any, count: int
) -> None:
    outcome(resolve_root, mutate(SHIPPED[name], rng, replacement, count))


# -- random override sets and argv lists -------------------------------------------------------------------

OVERRIDE_KEYS = [
    "training.max_steps", "training.seed", "optimizer.lr", "optimizer.betas", "optimizer.betas[1]",
    "optimizer._target_", "model._target_", "model.flavor", "model.overrides", "model.overrides.n_layers",
    "parallelism.tp", "parallelism.pp", "parallelism.pp_layer_split[2]", "loss.reduction", "nope.x",
    "training", "training.nope", "lr_scheduler.decay_type", "dataloader.dataset.paths[0]", "metrics.run_name",
    "checkpoint.interval", "x[0]", "training.max_steps[3]", "model.weights_path.x",
]  # fmt: skip
override_values = st.one_of(
    st.sampled_from(
        ["1", "0", "-1", "1e-4", "true", "null", "[1, 2]", "{a: 1}", "'x'", "[", "", "2B", "mean"]
    ),
    st.sampled_from(TARGETS),
    st.text(max_size=15),
    scalars,
)
override_keys = st.one_of(st.sampled_from(OVERRIDE_KEYS), st.text(max_size=15), st.integers())


@given(st.dictionaries(override_keys, override_values, max_size=5))
def test_random_overrides_apply_or_fail_cleanly(overrides: dict[Any, Any]) -> None:
    outcome(apply_overrides, BASE, overrides)


@given(
    st.sampled_from(CONFIG_FILES),
    st.dictionaries(
        st.sampled_from(OVERRIDE_KEYS), override_values.filter(lambda v: isinstance(v, str)), max_size=4
    ),
)
def test_random_overrides_through_load_config(path: Path, overrides: dict[str, str]) -> None:
    outcome(load_config, path, overrides)


FLAGS = [
    "--config-file", "--dry-run", "--print-config", "--world-size", "--allow-target", "--help",
    "-h", "--", "-x", "--config-file=", "--dry-run=1", "--optimizer.lr", "--optimizer._target_",
    "--world-size=8",
    "--training.max_steps=5", "--nope", "--a.b", "--parallelism.tp",
]  # fmt: skip
ARGS = [str(p) for p in CONFIG_FILES] + [str(_TMP / "missing.yaml"), str(_TMP), "8", "0", "-1", "\u00b2"]
argv_tokens = st.one_of(
    st.sampled_from(FLAGS), st.sampled_from(ARGS), st.sampled_from(TARGETS), override_values.map(str)
)


@given(st.lists(argv_tokens, max_size=10), st.booleans())
def test_random_argv_exits_0_2_or_3(argv: list[str], dump: bool) -> None:
    import time

    # --dump-config only ever writes into the fuzz directory, never over a shipped config.
    argv = [a for a in argv if not a.startswith("--dump")]
    if dump:
        argv = [*argv, "--dump-config", str(_TMP / "dump.yaml")]
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    code = main(argv, out=out, err=err)
    assert time.process_time() - start < PER_INPUT
    assert code in (0, 2, 3)
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().endswith("nothing was started.\n")
