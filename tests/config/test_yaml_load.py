"""Tests for hyper_parallel.config.yaml_load: YAML 1.2 core schema, positions, and every refusal."""

import math
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.config.yaml_load import (
    MAX_BYTES,
    MAX_CHARS,
    MAX_DEPTH,
    MAX_NODES,
    Mark,
    SourceMap,
    load_yaml_file,
    parse_scalar,
    parse_yaml,
)
from hyper_parallel.errors import ConfigError, Issue


def issues_of(text: str | bytes, filename: str = "f.yaml") -> tuple[Issue, ...]:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, filename)
    # Never a PyYAML traceback chained to ours.
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ or info.value.__context__ is None
    return info.value.issues


def one_issue(text: str | bytes, filename: str = "f.yaml") -> Issue:
    issues = issues_of(text, filename)
    assert len(issues) == 1, issues
    return issues[0]


# --- plain scalars: YAML 1.2 core schema -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e-4", 1e-4),
        ("3.0e-4", 3e-4),
        ("1E+3", 1000.0),
        ("-2.5e-3", -2.5e-3),
        (".5", 0.5),
        ("+.5", 0.5),
        ("1.", 1.0),
        ("1.0", 1.0),
        ("-0.0", 0.0),
        ("1e5", 100000.0),
        (".inf", math.inf),
        (".Inf", math.inf),
        ("+.INF", math.inf),
        ("-.inf", -math.inf),
        ("200", 200),
        ("+7", 7),
        ("-12", -12),
        ("010", 10),
        ("0", 0),
        ("0o17", 15),
        ("0x1F", 31),
        ("0xff", 255),
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("false", False),
        ("False", False),
        ("FALSE", False),
        ("null", None),
        ("Null", None),
        ("NULL", None),
        ("~", None),
        ("", None),
        # Everything else is a string: no YAML 1.1 booleans, dates, separators or sexagesimals.
        ("yes", "yes"),
        ("no", "no"),
        ("on", "on"),
        ("off", "off"),
        ("Yes", "Yes"),
        ("y", "y"),
        ("n", "n"),
        ("tRUE", "tRUE"),
        ("nULL", "nULL"),
        ("2024-01-01", "2024-01-01"),
        ("2024-01-01T12:00:00Z", "2024-01-01T12:00:00Z"),
        ("1_000", "1_000"),
        ("1:30", "1:30"),
        ("0b101", "0b101"),
        ("-0x1F", "-0x1F"),
        ("0o8", "0o8"),
        ("1e", "1e"),
        (".", "."),
        ("+", "+"),
        ("1.2.3", "1.2.3"),
        ("inf", "inf"),
        ("nan", "nan"),
        ("=", "="),
        ("hello world", "hello world"),
        ("ünïcödé ✓", "ünïcödé ✓"),
        ("bf16", "bf16"),
    ],
)
def test_plain_scalar_core_schema(text: str, expected: object) -> None:
    value, _ = parse_yaml(f"key: {text}\n")
    assert value == {"key": expected}
    assert type(value["key"]) is type(expected)


@pytest.mark.parametrize("text", [".nan", ".NaN", ".NAN"])
def test_nan(text: str) -> None:
    value, _ = parse_yaml(f"x: {text}")
    assert math.isnan(value["x"])  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("'1e-4'", "1e-4"),
        ('"true"', "true"),
        ("'null'", "null"),
        ("''", ""),
        ('"200"', "200"),
        ("|\n  123\n", "123\n"),
        (">-\n  true\n", "true"),
        # Explicit standard tags are applied.
        ("!!str 123", "123"),
        ("!!str true", "true"),
        ("!!int '42'", 42),
        ("!!int 0x10", 16),
        ("!!float 1", 1.0),
        ("!!float '1e-4'", 1e-4),
        ("!!bool 'true'", True),
        ("!!null ''", None),
        ("!!null ~", None),
        ("!!map {a: 1}", {"a": 1}),
        ("!!seq [1, yes]", [1, "yes"]),
        ("!<tag:yaml.org,2002:int> '5'", 5),
    ],
)
def test_quoted_and_tagged(text: str, expected: object) -> None:
    value, _ = parse_yaml(f"key: {text}")
    assert value == {"key": expected}
    assert type(value["key"]) is type(expected)


def test_root_may_be_list_or_scalar() -> None:
    assert parse_yaml("- 1\n- yes\n")[0] == [1, "yes"]
    assert parse_yaml("hello")[0] == "hello"
    assert parse_yaml("42")[0] == 42
    assert parse_yaml("null")[0] is None


def test_block_structure_and_order() -> None:
    text = "b: 1\na:\n  - x: 1e-4\n    y: [1, {z: off}]\n  - 2024-01-01\n"
    value, _ = parse_yaml(text)
    assert value == {"b": 1, "a": [{"x": 1e-4, "y": [1, {"z": "off"}]}, "2024-01-01"]}
    assert list(value) == ["b", "a"]


def test_bytes_input_and_bom() -> None:
    assert parse_yaml("a: é\n".encode())[0] == {"a": "é"}
    assert parse_yaml(b"\xef\xbb\xbfa: 1\n")[0] == {"a": 1}


# --- tags ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("!!python/object/apply:os.system ['echo hi']", "'!!python/object/apply:os.system'"),
        ("!!python/name:os.system ''", "'!!python/name:os.system'"),
        ("!!python/object:collections.OrderedDict {}", "'!!python/object:collections.OrderedDict'"),
        ("!foo bar", "'!foo'"),
        ("!!binary aGk=", "'!!binary'"),
        ("!!timestamp 2024-01-01", "'!!timestamp'"),
        ("!!set {a}", "'!!set'"),
        ("!!omap [a: 1]", "'!!omap'"),
        ("!!pairs [a: 1]", "'!!pairs'"),
        ("!!merge x", "'!!merge'"),
    ],
)
def test_unsupported_tag(text: str, fragment: str) -> None:
    issue = one_issue(f"a: 1\nkey: {text}\n")
    assert issue.path == "key"
    assert issue.location == "f.yaml:2:6"
    assert f"unsupported tag {fragment}" in issue.message
    assert "!!str, !!int" in issue.message


def test_python_tag_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f"x: !!python/object/apply:os.system ['touch {marker}']\n"
    issues_of(text)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("!!int abc", "'abc' is not an integer"),
        ("!!int 1.5", "'1.5' is not an integer"),
        ("!!float abc", "'abc' is not a float"),
        ("!!bool yes", "'yes' is not a boolean"),
        ("!!null x", "'x' is not null"),
        ("!!str {a: 1}", "tag !!str cannot be applied to a mapping"),
        ("!!map [1]", "tag !!map cannot be applied to a sequence"),
        ("!!seq 1", "tag !!seq cannot be applied to a scalar"),
        ("!!int [1]", "tag !!int cannot be applied to a sequence"),
    ],
)
def test_bad_tagged_value(text: str, fragment: str) -> None:
    issue = one_issue(f"key: {text}")
    assert issue.path == "key"
    assert issue.location == "f.yaml:1:6"
    assert fragment in issue.message


# --- keys ------------------------------------------------------------------------------------------------


def test_duplicate_key_names_both_lines() -> None:
    issue = one_issue("a: 1\nlr: 2\nb: 3\nlr: 4\n")
    assert issue == Issue(
        path="lr", message="duplicate key 'lr' (first defined at line 2)", location="f.yaml:4:1"
    )


def test_nested_duplicate_key_and_all_issues_at_once() -> None:
    text = "opt:\n  lr: 1\n  lr: 2\nx: !foo 1\nopt2: {a: 1, a: 2}\n"
    issues = issues_of(text)
    assert [(i.path, i.location) for i in issues] == [
        ("opt.lr", "f.yaml:3:3"),
        ("x", "f.yaml:4:4"),
        ("opt2.a", "f.yaml:5:14"),
    ]
    assert "first defined at line 2" in issues[0].message
    assert "first defined at line 5" in issues[2].message


@pytest.mark.parametrize(
    ("text", "location", "fragment"),
    [
        ("1: a", "f.yaml:2:3", "mapping key is int '1'"),
        ("0x1F: a", "f.yaml:2:3", "mapping key is int '0x1F'"),
        ("1.5: a", "f.yaml:2:3", "mapping key is float '1.5'"),
        ("true: a", "f.yaml:2:3", "mapping key is bool 'true'"),
        ("null: a", "f.yaml:2:3", "mapping key is null"),
        ("~: a", "f.yaml:2:3", "mapping key is null"),
        ("?\n  : a", "f.yaml:2:4", "mapping key is null"),
        ("!!int '3': a", "f.yaml:2:3", "mapping key tagged !!int"),
        ("!foo k: a", "f.yaml:2:3", "unsupported tag '!foo'"),
        ("[a, b]: 1", "f.yaml:2:3", "a sequence cannot be a mapping key"),
        ("{a: 1}: 2", "f.yaml:2:3", "a mapping cannot be a mapping key"),
        ("? [a]\n  : 1", "f.yaml:2:5", "a sequence cannot be a mapping key"),
    ],
)
def test_non_string_key(text: str, location: str, fragment: str) -> None:
    issue = one_issue(f"outer:\n  {text}\n")
    assert issue.path == "outer"
    assert issue.location == location
    assert fragment in issue.message
    assert "keys must be strings" in issue.message or "unsupported tag" in issue.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("'1': a", {"1": "a"}),
        ('"true": a', {"true": "a"}),
        ("!!str 1: a", {"1": "a"}),
        ("yes: a", {"yes": "a"}),
        ("'<<': a", {"<<": "a"}),
    ],
)
def test_string_keys(text: str, expected: object) -> None:
    assert parse_yaml(text)[0] == expected


def test_merge_key_refused() -> None:
    issue = one_issue("base: &b {a: 1}\nchild:\n  <<: *b\n  c: 2\n")
    assert issue.path == "child"
    assert issue.location == "f.yaml:3:3"
    assert "merge keys ('<<') are YAML 1.1" in issue.message


# --- anchors and aliases ---------------------------------------------------------------------------------


def test_aliases_expand_to_independent_copies() -> None:
    value, smap = parse_yaml("a: &x [1, {b: 2}]\nc: *x\n")
    assert value == {"a": [1, {"b": 2}], "c": [1, {"b": 2}]}
    assert value["a"] is not value["c"]
    assert value["a"][1] is not value["c"][1]
    # A value reached through an alias is located at the anchored node.
    assert smap.value(("c", 1, "b")) == Mark("<string>", 1, 15)
    assert smap.key(("c",)) == Mark("<string>", 2, 1)


def billion_laughs(levels: int = 9) -> str:
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, levels + 1):
        refs = ", ".join(f"*lol{level - 1}" for _ in range(10))
        lines.append(f"lol{level}: &lol{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_refused_fast() -> None:
    start = time.process_time()  # CPU time, not wall-clock: a loaded machine does not make it flaky
    issue = one_issue(billion_laughs())
    assert time.process_time() - start < 1.0
    assert f"more than {MAX_NODES} nodes" in issue.message
    assert issue.location is not None
    assert issue.location.startswith("f.yaml:")


def test_small_alias_fan_out_is_fine() -> None:
    value, _ = parse_yaml(billion_laughs(levels=3))
    assert len(value["lol3"]) == 10  # type: ignore[index]


def test_too_many_literal_nodes_refused_while_composing() -> None:
    text = "[" + "1," * (MAX_NODES + 1) + "]"
    start = time.process_time()  # CPU time: a loaded machine (CI on 2 cores) does not make it flaky
    issue = one_issue(text)
    assert time.process_time() - start < (2.0 if yaml.__with_libyaml__ else 10.0)
    assert issue.location == "f.yaml:1:1"
    assert f"more than {MAX_NODES} nodes" in issue.message


CHARS = f"document expands to more than {MAX_CHARS} characters of text (MAX_CHARS); check its aliases"


def test_text_budget_equals_the_size_limit() -> None:
    # A file without aliases holds no more text than its size: only expansion can spend MAX_CHARS.
    assert MAX_CHARS == MAX_BYTES == 4 * 1024 * 1024


def test_a_file_at_the_size_limit_without_aliases_is_within_the_text_budget() -> None:
    text = "a: " + "x" * (MAX_BYTES - 4) + "\n"
    value, _ = parse_yaml(text)
    assert len(value["a"]) == MAX_BYTES - 4  # type: ignore[index]


@pytest.mark.parametrize("extra", [0, 1])
def test_an_alias_costs_the_text_it_expands_to(extra: int) -> None:
    # Keys 'a' and 'b' (2 characters) and the string twice: exactly MAX_CHARS, then one more.
    size = (MAX_CHARS - 2) // 2
    text = f"a: &x {'x' * size}\nb: *x{' ' * extra}\n"
    if extra == 0:
        value, smap = parse_yaml(text)
        assert value["b"] is value["a"]  # type: ignore[index]
        assert smap.value(("b",)) == Mark("<string>", 1, 4)
        return
    issue = one_issue(f"a: &x {'x' * (size + 1)}\nb: *x\n")
    assert (issue.location, issue.path, issue.message) == ("f.yaml:1:4", "b", CHARS)


def test_aliases_of_a_mapping_cost_its_keys_and_values_each_time() -> None:
    value = "v" * 100_000
    body = ", ".join(f"k{i}: {value}" for i in range(10))  # 1,000,020 characters per copy
    issue = one_issue(f"m: &m {{{body}}}\nl: [*m, *m, *m, *m]\n")
    # m, then three copies: 4,000,082 characters; the fourth copy's k1 passes the budget.
    assert (issue.path, issue.message) == ("l[3].k1", CHARS)
    assert issue.location == f"f.yaml:1:{len('m: &m {k0: ') + len(value) + len(', k1: ') + 1}"


def test_an_alias_bomb_of_long_strings_is_refused_before_it_is_built() -> None:
    text = f"s: &s {'a' * 1_000_000}\nl: [" + ", ".join(["*s"] * 75_000) + "]\n"
    start = time.process_time()
    issue = one_issue(text)
    assert time.process_time() - start < 1.0
    assert (issue.location, issue.path, issue.message) == ("f.yaml:1:4", "l[3]", CHARS)


@pytest.mark.parametrize(
    ("text", "path", "location"),
    [
        ("a: &x [1, *x]\n", "a[1]", "f.yaml:1:4"),
        ("a: &x {b: {c: *x}}\n", "a.b.c", "f.yaml:1:4"),
        ("&x [*x]\n", "[0]", "f.yaml:1:1"),
    ],
)
def test_recursive_alias_refused(text: str, path: str, location: str) -> None:
    issue = one_issue(text)
    assert issue.path == path
    assert issue.location == location
    assert "recursive alias" in issue.message


def test_undefined_alias() -> None:
    issue = one_issue("a: 1\nb: *nope\n")
    assert issue.location == "f.yaml:2:4"
    assert "undefined alias" in issue.message


def test_duplicate_anchor() -> None:
    issue = one_issue("a: &x 1\nb: &x 2\n")
    assert issue.location == "f.yaml:2:4"
    assert "duplicate anchor" in issue.message


# --- limits ----------------------------------------------------------------------------------------------


def nested_flow(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_depth_limit_accepts_max_depth() -> None:
    value, _ = parse_yaml(nested_flow(MAX_DEPTH))
    for _ in range(MAX_DEPTH - 1):
        assert isinstance(value, list)
        value = value[0]
    assert value == []


def test_depth_limit_flow() -> None:
    issue = one_issue(nested_flow(MAX_DEPTH + 1))
    assert issue.path == "[0]" * MAX_DEPTH
    assert issue.location == f"f.yaml:1:{MAX_DEPTH + 1}"
    assert f"deeper than {MAX_DEPTH} levels" in issue.message


def test_depth_limit_block() -> None:
    text = "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 1)) + "  " * (MAX_DEPTH + 1) + "x: 1\n"
    issue = one_issue(text)
    assert issue.path == ".".join(f"k{i}" for i in range(MAX_DEPTH))
    assert issue.location == f"f.yaml:{MAX_DEPTH + 1}:{2 * MAX_DEPTH + 1}"
    assert "MAX_DEPTH" in issue.message


@pytest.mark.parametrize("levels", [1_000, 5_000, 200_000])
def test_extreme_nesting_is_a_config_error(levels: int) -> None:
    issue = one_issue(nested_flow(levels))
    assert issue.location is not None
    assert issue.location.startswith("f.yaml:")
    assert "nesting" in issue.message


def test_alias_cannot_bypass_depth_limit() -> None:
    deep = "[" * 40 + "1" + "]" * 40
    issue = one_issue(f"a: &d {deep}\nb: " + "[" * 30 + "*d" + "]" * 30 + "\n")
    assert issue.path.startswith("b" + "[0]" * 30)
    assert "MAX_DEPTH" in issue.message


@pytest.mark.parametrize("as_bytes", [False, True])
def test_size_limit(as_bytes: bool) -> None:
    text = "a: " + "x" * MAX_BYTES
    issue = one_issue(text.encode() if as_bytes else text)
    assert issue.path == ""
    assert issue.location == "f.yaml:1:1"
    assert f"the limit is {MAX_BYTES} bytes" in issue.message


def test_size_limit_counts_utf8_bytes() -> None:
    text = "a: " + "é" * (MAX_BYTES // 2)  # fewer characters than MAX_BYTES, more bytes
    assert len(text) < MAX_BYTES
    assert "MAX_BYTES" in one_issue(text).message


def test_long_string_within_limit_is_fine() -> None:
    value, _ = parse_yaml("a: " + "x" * 100_000)
    assert len(value["a"]) == 100_000  # type: ignore[index]


# --- encoding, characters, documents, syntax -------------------------------------------------------------


def test_non_utf8() -> None:
    issue = one_issue(b"a: 1\nb: caf\xe9\n")
    assert issue.path == ""
    assert issue.location == "f.yaml:2:7"
    assert "not valid UTF-8 (byte 0xe9" in issue.message


@pytest.mark.parametrize(
    ("text", "location", "fragment"),
    [
        ("a: 1\nb: x\x00y\n", "f.yaml:2:5", "NUL character (U+0000) is not allowed"),
        ("a: 'x\x07'\n", "f.yaml:1:6", "character U+0007 is not allowed"),
        ("a: \x1b[31m\n", "f.yaml:1:4", "character U+001B is not allowed"),
        ("a: x\ufffe\n", "f.yaml:1:5", "character U+FFFE is not allowed"),
    ],
)
def test_forbidden_characters(text: str, location: str, fragment: str) -> None:
    issue = one_issue(text)
    assert issue.location == location
    assert fragment in issue.message


def test_nul_in_bytes() -> None:
    issue = one_issue(b"a: 1\x00\n")
    assert issue.location == "f.yaml:1:5"
    assert "NUL" in issue.message


def test_multiple_documents() -> None:
    issue = one_issue("a: 1\n---\nb: 2\n")
    assert issue.path == ""
    assert issue.location == "f.yaml:2:1"
    assert "several YAML documents" in issue.message


@pytest.mark.parametrize("text", ["", "   \n\n", "# only a comment\n# another\n", "---\n", "--- # c\n...\n"])
def test_empty_document(text: str) -> None:
    issue = one_issue(text)
    assert issue == Issue(path="", message=issue.message, location="f.yaml:1:1")
    assert "empty document" in issue.message


@pytest.mark.parametrize(
    ("text", "location", "fragment"),
    [
        ("a: b: c\n", "f.yaml:1:5", "mapping values are not allowed"),
        ("a: [1, 2\nb: 3\n", "f.yaml:2:2", "did not find expected ',' or ']'"),
        ("a: 1\n  b: 2\n", "f.yaml:2:4", "mapping values are not allowed"),
        ("a: 'open\n", "f.yaml:2:1", "found unexpected end of stream"),
        ("- a\nb: 1\n", "f.yaml:2:1", "did not find expected '-' indicator"),
    ],
)
def test_syntax_error_location(text: str, location: str, fragment: str) -> None:
    issue = one_issue(text)
    assert issue.path == ""
    assert issue.location == location
    assert issue.message.startswith("invalid YAML: ")
    if yaml.__with_libyaml__:  # the pure-Python parser words its problems differently
        assert fragment in issue.message


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary(), st.text(alphabet="[]{}:,-?&*!|>'\"#%@ \n\tab1.~")))
def test_only_config_errors(text: str | bytes) -> None:
    try:
        parse_yaml(text)
    except ConfigError as exc:
        for issue in exc.issues:
            assert issue.location is not None
            assert issue.location.startswith("<string>")


# --- the source map --------------------------------------------------------------------------------------

MAPPED = """\
model:
  name: llama
  layers: [1, 2]
train:
  - lr: 1.0e-4
    steps: 10
  - plain
"""


@pytest.mark.parametrize(
    ("path", "key", "value"),
    [
        ((), None, (1, 1)),
        (("model",), (1, 1), (2, 3)),
        (("model", "name"), (2, 3), (2, 9)),
        (("model", "layers"), (3, 3), (3, 11)),
        (("model", "layers", 0), None, (3, 12)),
        (("model", "layers", 1), None, (3, 15)),
        (("train",), (4, 1), (5, 3)),
        (("train", 0), None, (5, 5)),
        (("train", 0, "lr"), (5, 5), (5, 9)),
        (("train", 0, "steps"), (6, 5), (6, 12)),
        (("train", 1), None, (7, 5)),
    ],
)
def test_source_map_positions(
    path: tuple[str | int, ...], key: tuple[int, int] | None, value: tuple[int, int]
) -> None:
    _, smap = parse_yaml(MAPPED, "cfg.yaml")
    assert path in smap
    assert smap.key(path) == (None if key is None else Mark("cfg.yaml", *key))
    assert smap.value(path) == Mark("cfg.yaml", *value)


def test_source_map_absent_paths_and_helpers() -> None:
    _, smap = parse_yaml(MAPPED, "cfg.yaml")
    assert isinstance(smap, SourceMap)
    assert ("model", "nope") not in smap
    assert ("train", 2) not in smap
    assert smap.key(("model", "nope")) is None
    assert smap.value(("model", "nope")) is None
    assert smap.nearest(("model", "nope", "deeper")) == Mark("cfg.yaml", 2, 3)
    assert smap.location(("train", 0, "missing")) == "cfg.yaml:5:5"
    assert len(smap) == 11
    assert list(smap.paths())[:3] == [(), ("model",), ("model", "name")]
    assert str(smap.value(("model", "name"))) == "cfg.yaml:2:9"
    assert "cfg.yaml" in repr(smap)


def test_mark_str() -> None:
    assert str(Mark("path/to/file.yaml", 12, 7)) == "path/to/file.yaml:12:7"


# --- files -----------------------------------------------------------------------------------------------


def test_load_file_marks_use_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cfg.yaml").write_text("a:\n  b: 1e-4\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    value, smap = load_yaml_file("cfg.yaml")
    assert value == {"a": {"b": 1e-4}}
    assert str(smap.value(("a", "b"))) == "cfg.yaml:2:6"
    value, smap = load_yaml_file(tmp_path / "cfg.yaml")
    assert smap.file == str(tmp_path / "cfg.yaml")
    assert str(smap.key(("a",))) == f"{tmp_path / 'cfg.yaml'}:1:1"


def test_load_file_error_uses_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\na: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_yaml_file(path)
    assert info.value.issues[0].location == f"{path}:2:1"


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda p: p / "missing.yaml", "file not found"),
        (lambda p: p, "is a directory"),
    ],
)
def test_load_file_unreadable(tmp_path: Path, make: object, fragment: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        load_yaml_file(target)
    (issue,) = info.value.issues
    assert issue.path == ""
    assert issue.location == os.fspath(target)
    assert fragment in issue.message


def test_load_file_too_big(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"x" * MAX_BYTES)
    with pytest.raises(ConfigError) as info:
        load_yaml_file(path)
    (issue,) = info.value.issues
    assert issue.location == f"{path}:1:1"
    assert "MAX_BYTES" in issue.message


# --- command-line values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e-4", 0.0001),
        ("200", 200),
        ("-3", -3),
        ("0x10", 16),
        (".5", 0.5),
        ("-.inf", -math.inf),
        ("true", True),
        ("False", False),
        ("null", None),
        ("~", None),
        ("[1, 2]", [1, 2]),
        ("[1, yes, 1e-4]", [1, "yes", 1e-4]),
        ("{a: 1}", {"a": 1}),
        ("{a: [1, {b: null}]}", {"a": [1, {"b": None}]}),
        ("yes", "yes"),
        ("off", "off"),
        ("2024-01-01", "2024-01-01"),
        ("1_000", "1_000"),
        ("", ""),
        ("  ", "  "),
        (" 3 ", 3),
        ("'1e-4'", "1e-4"),
        ('"true"', "true"),
        ("hello world", "hello world"),
        ("a: b", "a: b"),
        ("x # y", "x # y"),
        ("- a", "- a"),
        ("!!python/name:os.system", "!!python/name:os.system"),
        ("/path/to/weights", "/path/to/weights"),
    ],
)
def test_parse_scalar(text: str, expected: object) -> None:
    value = parse_scalar(text)
    assert value == expected
    assert type(value) is type(expected)


_SCALAR_WORDS = ["null", "Null", "NULL", "~", "true", "True", "TRUE", "false", "FALSE", ".inf", ".nan"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789+-.eEox_aF", max_size=12), st.sampled_from(_SCALAR_WORDS)))
def test_parse_scalar_reads_a_short_value_as_its_general_steps_do(text: str) -> None:
    # A short word or decimal number is read without the general steps; a leading space takes those
    # steps (the text is stripped before it is read as a plain scalar), which must give the same value.
    short, general = parse_scalar(text), parse_scalar(" " + text)
    if isinstance(general, str):
        assert (short, general) == (text, " " + text)
    else:
        assert type(short) is type(general)
        assert short == general or (short != short and general != general)  # NaN


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9" * 64, int("9" * 64)), ("9" * 65, int("9" * 65)), ("1" * 63 + ".5", float("1" * 63 + ".5"))],
)
def test_parse_scalar_reads_long_numbers_by_its_general_steps(text: str, expected: object) -> None:
    value = parse_scalar(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "location", "fragment"),
    [
        ("[1, 2", "<command line>:1:6", "invalid YAML"),
        ("{a: 1, a: 2}", "<command line>:1:8", "duplicate key 'a'"),
        ("[!!python/name:os.system x]", "<command line>:1:2", "unsupported tag"),
        ("x\x00", "<command line>:1:2", "NUL character"),
        ("[1] [2]", "<command line>:1:5", "invalid YAML"),
        ("9" * 5000, "<command line>:1:1", "integer with 5000 digits is too long"),
    ],
)
def test_parse_scalar_errors(text: str, location: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scalar(text)
    (issue,) = info.value.issues
    assert issue.location == location
    assert fragment in issue.message


def test_parse_scalar_source_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_scalar("[1,", source="--optimizer.betas")
    assert info.value.issues[0].location is not None
    assert info.value.issues[0].location == "--optimizer.betas:1:4"


def test_huge_integer_in_file_is_config_error() -> None:
    issue = one_issue("a: " + "9" * 5000)
    assert issue.path == "a"
    assert "too long" in issue.message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("a:\n\tb: 1\n", "f.yaml:2:1", id="tab-indents-a-key"),
        pytest.param("a:\n  b: 1\n\tc: 2\n", "f.yaml:3:1", id="tab-after-spaces-lines"),
        pytest.param("a:\n  b: 1\n \tc: 2\n", "f.yaml:3:2", id="tab-after-a-space"),
        pytest.param("a:\n  - 1\n\t- 2\n", "f.yaml:3:1", id="tab-indents-an-item"),
    ],
)
def test_a_tab_in_the_indentation_is_named(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    assert [(i.location, i.message) for i in info.value.issues] == [
        (where, "a tab in the indentation: YAML indents with spaces only; replace the tab with spaces")
    ]


def test_a_tab_after_a_key_is_whitespace() -> None:
    assert parse_yaml("a:\n  b:\t1\n", "f.yaml")[0] == {"a": {"b": 1}}
