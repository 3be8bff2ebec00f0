"""Issue 12 point 17: the JSON schema helps in an editor. One ``if``/``then`` branch per ``_target_`` puts
each error at the field that has it, bounds, lengths and choices come from the validators,
``--allow-target`` adds trusted classes, and descriptions are plain text."""

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hyper_parallel.config import converter
from hyper_parallel.config.schema import json_schema
from hyper_parallel.config.types import plain_text
from hyper_parallel.config.yaml_load import parse_yaml
from hyper_parallel.trainer.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
FULL = ROOT / "configs" / "qwen3_5_full.yaml"
OPT = "hyper_parallel.components.optimizer"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json_schema(converter, TrainerConfig)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def pointer(error: jsonschema.ValidationError) -> str:
    return "".join(f"/{part}" for part in error.absolute_path)


DELETE: Any = object()

#: Ten typical mistakes: (path in the document, value or DELETE, JSON pointer, message).
MISTAKES = [
    (("optimizer", "lr"), "3e-4", "/optimizer/lr", "'3e-4' is not of type 'number'"),
    (("optimizer", "lr"), -1.0, "/optimizer/lr", "-1.0 is less than or equal to the minimum of 0.0"),
    (
        ("optimizer", "betas"),
        [0.9, 1.5],
        "/optimizer/betas/1",
        "1.5 is greater than or equal to the maximum of 1.0",
    ),
    (("optimizer", "no_decay_names"), ["bias", ""], "/optimizer/no_decay_names/1", "'' should be non-empty"),
    (
        ("optimizer", "lrr"),
        1e-4,
        "/optimizer",
        "Additional properties are not allowed ('lrr' was unexpected)",
    ),
    (("optimizer", "_target_"), DELETE, "/optimizer", "'_target_' is a required property"),
    (("training", "max_steps"), 0, "/training/max_steps", "0 is less than or equal to the minimum of 0"),
    (
        ("training", "mixed_precision_param"),
        "bf16",
        "/training/mixed_precision_param",
        "'bf16' is not one of ['bfloat16', 'float16', 'float32']",
    ),
    (("parallelism", "tp"), True, "/parallelism/tp", "True is not of type 'integer'"),
    # a validator's own json_schema: a degree is -1 (inferred) or at least 1
    (("parallelism", "dp_shard"), 0, "/parallelism/dp_shard", "0 is less than the minimum of 1"),
    (("parallelism", "dp_shard"), -1, None, None),
    (("tokenizer", "path"), "", "/tokenizer/path", "'' should be non-empty"),
    (
        ("model", "flavor"),
        "7B",
        "/model/flavor",
        "'7B' is not one of ['debugmodel', '0.8B', '2B', '4B', '9B', 'auto', None]",
    ),
    (("trainer",), {}, "", "Additional properties are not allowed ('trainer' was unexpected)"),
]


@pytest.mark.parametrize(
    ("path", "value", "where", "message"), MISTAKES, ids=[str(m[2]) or "/" for m in MISTAKES]
)
def test_a_mistake_is_reported_at_the_field_that_has_it(
    validator: jsonschema.Draft202012Validator,
    path: tuple[str, ...],
    value: object,
    where: str | None,
    message: str | None,
) -> None:
    document = copy.deepcopy(parse_yaml(FULL.read_text())[0])
    node: Any = document
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    errors = [(pointer(e), e.message) for e in validator.iter_errors(document)]
    assert errors == ([] if where is None else [(where, message)])


def test_a_target_that_is_not_offered_is_reported_at_target(
    validator: jsonschema.Draft202012Validator,
) -> None:
    document = copy.deepcopy(parse_yaml(FULL.read_text())[0])
    document["optimizer"]["_target_"] = f"{OPT}.Optimizer.Config"
    ((where, message),) = [(pointer(e), e.message) for e in validator.iter_errors(document)]
    assert where == "/optimizer/_target_"
    assert message == f"'{OPT}.Optimizer.Config' is not one of ['{OPT}.AdamW.Config', '{OPT}.SGD.Config']"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(validator: jsonschema.Draft202012Validator, path: Path) -> None:
    assert list(validator.iter_errors(parse_yaml(path.read_text())[0])) == []


def test_a_switched_target_is_checked_against_its_own_fields(
    validator: jsonschema.Draft202012Validator,
) -> None:
    document = copy.deepcopy(parse_yaml(FULL.read_text())[0])
    document["optimizer"] = {"_target_": f"{OPT}.SGD.Config", "momentum": 0.9, "betas": [0.9, 0.95]}
    assert [(pointer(e), e.message) for e in validator.iter_errors(document)] == [
        ("/optimizer", "Additional properties are not allowed ('betas' was unexpected)")
    ]


def test_allowed_prefixes_add_trusted_classes() -> None:
    schema = json_schema(converter, TrainerConfig, ["tests.support.fake_targets"])
    optimizers = schema["properties"]["optimizer"]["properties"]["_target_"]["enum"]
    assert "tests.support.fake_targets.RecordingOptimizerConfig" in optimizers
    assert "tests.support.fake_targets.AbstractOptimizerConfig" not in optimizers
    default = json.dumps(json_schema(converter, TrainerConfig))
    assert "tests.support.fake_targets.RecordingOptimizerConfig" not in default


def run_schema(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hyper_parallel.config", "schema", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.multiprocess
def test_the_schema_command_takes_allow_target() -> None:
    done = run_schema("--allow-target", "tests.support.fake_targets")
    assert done.returncode == 0, done.stderr
    assert "tests.support.fake_targets.RecordingOptimizerConfig" in done.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("prefix", ["*", "", ".", ".tests", "tests..fake"])
def test_the_schema_command_refuses_a_prefix_that_is_not_a_module_name(prefix: str) -> None:
    done = run_schema("--allow-target", prefix)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        f"error: an allowed target prefix (--allow-target, allowed_targets=) {prefix!r} "
        "is not a dotted module name such as 'my_project.models'"
    )


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("Exempt ``bias`` parameters", "Exempt bias parameters"),
        ("See :class:`~hyper_parallel.models.ModelSpec`.", "See ModelSpec."),
        ("See :func:`hyper_parallel.config.load_config`", "See hyper_parallel.config.load_config"),
        ("Read :ref:`the guide <guide-label>` first", "Read the guide first"),
        ("**Never** *ever* 2 * 3 * 4", "Never ever 2 * 3 * 4"),
        ("a_b_c and a*b", "a_b_c and a*b"),
    ],
)
def test_descriptions_are_plain_text(text: str, plain: str) -> None:
    assert plain_text(text) == plain


def test_no_description_of_the_schema_has_rest_markup() -> None:
    descriptions: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("description"), str):
                descriptions.append(node["description"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json_schema(converter, TrainerConfig))
    assert len(descriptions) > 100
    assert [d for d in descriptions if "``" in d or ":class:`" in d or ":func:`" in d] == []
