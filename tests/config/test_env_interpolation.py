"""Issue 12 point 13: ``${env:NAME}`` and ``${env:NAME,default}`` are read from the environment when a file is
loaded; any other ``${...}`` is refused (never a silent literal path); ``$${`` and ``!!str`` are literal."""

import pytest
import yaml

from hyper_parallel.config import ConfigError, apply_overrides, dump_config, load_config
from hyper_parallel.config.yaml_dump import dump_yaml
from hyper_parallel.config.yaml_load import MAX_CHARS, expand_env, parse_yaml

LITERAL = "$${ writes a literal '${'"
ONLY_ENV = "only ${env:NAME} and ${env:NAME,default} are read (from the environment)"


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HP_DATA", "/data")
    monkeypatch.setenv("HP_STEPS", "250")
    monkeypatch.setenv("HP_TRICKY", "${env:HP_DATA}")
    monkeypatch.setenv("HP_EMPTY", "")
    monkeypatch.delenv("HP_UNSET", raising=False)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("x: ${env:HP_DATA}/train.jsonl", "/data/train.jsonl"),
        ("x: ${env:HP_STEPS}", 250),  # substituted before a plain scalar is read: an integer
        ("x: '${env:HP_STEPS}'", "250"),  # quoted: a string
        ('x: "${env:HP_DATA}-${env:HP_STEPS}"', "/data-250"),
        ("x: ${env:HP_UNSET,/fallback}", "/fallback"),
        ("x: ${env:HP_STEPS,7}", 250),  # a set variable wins over the default
        ("x: ${env:HP_UNSET,a,b}", "a,b"),  # the default runs to the closing brace
        ("x: '${env:HP_EMPTY,unused}'", ""),  # set but empty is set
        ("x: ${env:HP_UNSET,}", None),  # plain empty text is null, as in any YAML file
        ("x: ${env:HP_TRICKY}", "${env:HP_DATA}"),  # a value from the environment is not read again
        ("x: $${HP_DATA}/a", "${HP_DATA}/a"),
        ("x: a$$${HP_DATA}", "a$${HP_DATA}"),
        ("x: !!str ${DATA_DIR}", "${DATA_DIR}"),
        ("x: !!int ${env:HP_STEPS}", 250),
        ("x: |\n  ${env:HP_DATA}\n", "/data\n"),
        ("x: $HP_DATA and {a}", "$HP_DATA and {a}"),
    ],
)
def test_environment_references_are_read_when_the_file_is_loaded(text: str, value: object) -> None:
    assert parse_yaml(text, "f.yaml")[0] == {"x": value}


def test_keys_are_never_interpolated() -> None:
    assert parse_yaml("${env:HP_DATA}: 1\n")[0] == {"${env:HP_DATA}": 1}


@pytest.mark.parametrize(
    ("text", "location", "message"),
    [
        (
            "x: ${DATA_DIR}/train.jsonl",
            "f.yaml:1:4",
            "interpolation '${DATA_DIR}' is not supported (did you mean '${env:DATA_DIR}'?); "
            f"{ONLY_ENV}; {LITERAL}",
        ),
        (
            "x: /a/${oc.env:HOME,/h}/b",
            "f.yaml:1:7",
            f"interpolation '${{oc.env:HOME,/h}}' is not supported (did you mean '${{env:HOME,/h}}'?); "
            f"{ONLY_ENV}; {LITERAL}",
        ),
        (
            "x: ${training.seq_len}",
            "f.yaml:1:4",
            f"interpolation '${{training.seq_len}}' is not supported; {ONLY_ENV}; {LITERAL}",
        ),
        (
            "x: ${env:HP_UNSET}",
            "f.yaml:1:4",
            "environment variable HP_UNSET is not set ('${env:HP_UNSET}'); "
            "set it, or give a default: '${env:HP_UNSET,DEFAULT}'",
        ),
        ("x: ${env:1A}", "f.yaml:1:4", "'1A' in '${env:1A}' is not an environment variable name"),
        ("x: ${env:}", "f.yaml:1:4", "'' in '${env:}' is not an environment variable name"),
        ("x: a ${env:HP_DATA", "f.yaml:1:6", f"unterminated '${{' (no closing '}}'); {LITERAL}"),
        ("x: ${env:A,${env:B}}", "f.yaml:1:4", "nested interpolation in '${env:A,${env:B}' is not supported"),
        # quoted and multi-line scalars are located at their start
        (
            "x:\n  - 'a ${X}'",
            "f.yaml:2:5",
            "interpolation '${X}' is not supported (did you mean '${env:X}'?)",
        ),
    ],
)
def test_anything_else_is_refused_where_it_is(text: str, location: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    ((got_location, got_message),) = [(i.location, i.message) for i in info.value.issues]
    assert got_location == location
    assert got_message.startswith(message)


@pytest.mark.parametrize(
    ("text", "location"),
    [
        ("x: &a ${env:HP_UNSET}", "f.yaml:1:7"),
        ("x: !!int ${env:HP_UNSET}", "f.yaml:1:10"),
        ("x: &a !!str a\ny: &b !!int a${X}b # c", "f.yaml:2:14"),
        ("x:\n- &a a${X}", "f.yaml:2:7"),
    ],
)
def test_a_reference_after_an_anchor_or_tag_is_located_at_itself(text: str, location: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    assert [i.location for i in info.value.issues] == [location]


def test_every_bad_reference_of_a_file_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: ${A}\nb:\n  c: x${env:HP_UNSET}y ${B}\n", "f.yaml")
    assert [(i.location, i.path) for i in info.value.issues] == [
        ("f.yaml:1:4", "a"),
        ("f.yaml:3:7", "b.c"),
        ("f.yaml:3:24", "b.c"),
    ]


# -- once per node: aliases reuse the interpolated value -----------------------------------------------------


def test_aliases_of_an_interpolated_scalar_share_its_one_value() -> None:
    value, smap = parse_yaml("a: &p ${env:HP_DATA}/train.jsonl\nb: *p\nc: [*p, *p]\n", "f.yaml")
    assert value == {"a": "/data/train.jsonl", "b": "/data/train.jsonl", "c": ["/data/train.jsonl"] * 2}
    assert value["b"] is value["a"]  # type: ignore[index]
    assert all(v is value["a"] for v in value["c"])  # type: ignore[index]
    assert str(smap.value(("c", 1))) == "f.yaml:1:4"  # the anchored node


@pytest.mark.parametrize(
    ("anchored", "expected"),
    [
        ("${env:HP_UNSET,/fallback}", "/fallback"),
        ("${env:HP_STEPS,7}", 250),
        ("'${env:HP_STEPS,7}'", "250"),
        ("$${HP_DATA}", "${HP_DATA}"),
        ("!!str ${env:HP_DATA}", "${env:HP_DATA}"),
    ],
)
def test_an_anchored_reference_reads_the_same_through_every_alias(anchored: str, expected: object) -> None:
    value, _ = parse_yaml(f"a: &x {anchored}\nb: [*x, *x]\nc: {{d: *x}}\n")
    assert value == {"a": expected, "b": [expected, expected], "c": {"d": expected}}


def test_a_bad_reference_in_an_anchored_scalar_is_reported_once_at_the_anchor() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: &x ${env:HP_UNSET}/a\nb: *x\nc: [*x, *x]\n", "f.yaml")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "f.yaml:1:7",
            "a",
            "environment variable HP_UNSET is not set ('${env:HP_UNSET}'); "
            "set it, or give a default: '${env:HP_UNSET,DEFAULT}'",
        )
    ]


def test_interpolated_text_counts_against_the_text_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HP_BIG", "a" * 1_000_000)
    with pytest.raises(ConfigError) as info:
        parse_yaml("x:\n" + "- ${env:HP_BIG}\n" * 5, "f.yaml")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "f.yaml:6:3",
            "x[4]",
            f"document expands to more than {MAX_CHARS} characters of text (MAX_CHARS); check its aliases",
        )
    ]


CONFIG = """\
model:
  _target_: hyper_parallel.models.llama3.create_model_spec
  flavor: debugmodel
  weights_path: ${env:HP_DATA}/weights
training:
  _target_: hyper_parallel.trainer.config.TrainingConfig
  max_steps: ${env:HP_STEPS}
metrics:
  _target_: hyper_parallel.components.metrics.MetricsLogger.Config
  run_name: $${not_a_reference}
"""


def test_a_dump_writes_the_resolved_values_and_loads_back_equal() -> None:
    cfg = load_config("run.yaml", text=CONFIG)
    assert (cfg.model.weights_path, cfg.training.max_steps) == ("/data/weights", 250)
    assert cfg.metrics.run_name == "${not_a_reference}"
    text = dump_config(cfg)
    assert "  weights_path: /data/weights\n" in text
    assert "  max_steps: 250\n" in text
    assert "  run_name: !!str '${not_a_reference}'\n" in text
    assert load_config("dump.yaml", text=text) == cfg


@pytest.mark.parametrize("value", ["${x}", "a ${env:HOME} b", "$${y}", "line\n${z}"])
def test_dumped_text_with_a_reference_is_verbatim_for_both_loaders(value: str) -> None:
    text = dump_yaml({"k": value, "l": [value]})
    assert parse_yaml(text)[0] == {"k": value, "l": [value]}
    assert yaml.safe_load(text) == {"k": value, "l": [value]}


def test_command_line_values_are_read_the_same_way() -> None:
    cfg = load_config("configs/llama3_debug.yaml")
    new = apply_overrides(
        cfg, {"metrics.run_name": "r-${env:HP_STEPS}", "training.max_steps": "${env:HP_UNSET,12}"}
    )
    assert (new.metrics.run_name, new.training.max_steps) == ("r-250", 12)
    assert apply_overrides(cfg, {"metrics.run_name": "$${x}"}).metrics.run_name == "${x}"
    with pytest.raises(ConfigError) as info:
        load_config("configs/llama3_debug.yaml", {"dataloader.dataset.paths": "[${DATA_DIR}/a.jsonl]"})
    (issue,) = info.value.issues
    assert (issue.location, issue.path) == (
        "overrides['dataloader.dataset.paths']",
        "dataloader.dataset.paths",
    )
    assert issue.message == (
        "cannot read '[${DATA_DIR}/a.jsonl]': interpolation '${DATA_DIR}' is not supported (did you mean "
        f"'${{env:DATA_DIR}}'?); {ONLY_ENV}; {LITERAL} (column 2)"
    )


def test_expand_env_locates_the_reference_in_its_source() -> None:
    assert expand_env("no references") == "no references"
    with pytest.raises(ConfigError) as info:
        expand_env("abc${X}", "--x")
    assert [(i.location, i.path) for i in info.value.issues] == [("--x:1:4", "")]
