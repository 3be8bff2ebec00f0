"""The one parser of ``a.b[2]`` paths: an override's key (strict: None when malformed) and an issue's path
read back into parts (lenient: a segment that is no name with indices is kept whole)."""

import pytest

from hyper_parallel.config.overrides import parse_path as overrides_parse_path
from hyper_parallel.errors import format_path, parse_path, split_path

WELL_FORMED = [
    ("optimizer", ("optimizer",)),
    ("optimizer.lr", ("optimizer", "lr")),
    ("parallelism.pp_layer_split[2]", ("parallelism", "pp_layer_split", 2)),
    ("x[1][3].y", ("x", 1, 3, "y")),
    ("a._target_", ("a", "_target_")),
    ("a.b[999999999]", ("a", "b", 999999999)),
]


@pytest.mark.parametrize(("path", "parts"), WELL_FORMED)
def test_a_well_formed_path_parses_the_same_both_ways_and_shows_back_as_written(
    path: str, parts: tuple[object, ...]
) -> None:
    assert parse_path(path) == parts
    assert split_path(path) == parts
    assert format_path(parts) == path  # type: ignore[arg-type]


def test_a_removal_key_names_the_path_after_its_tilde() -> None:
    assert parse_path("~optimizer.betas") == ("optimizer", "betas")
    assert parse_path("~~optimizer.betas") is None


@pytest.mark.parametrize(
    ("key", "lenient"),
    [
        ("", ()),  # the whole document, for an issue
        ("a..b", ("a", "", "b")),
        ("a.", ("a", "")),
        (".a", ("", "a")),
        ("a[", ("a[",)),
        ("a[]", ("a[]",)),
        ("a[x]", ("a[x]",)),  # only digits index
        ("a[1]x", ("a[1]x",)),
        ("a[-1]", ("a[-1]",)),
        ("a[1234567890]", ("a[1234567890]",)),  # at most 9 digits: int() is never asked for a huge one
        ("a[\u0661]", ("a[\u0661]",)),  # ASCII digits only
        ("1a.b", ("1a", "b")),
        ("a-b.c", ("a-b", "c")),
        ("a b", ("a b",)),
        ("a\n", ("a\n",)),
        ("top level", ()),
    ],
)
def test_a_malformed_key_is_refused_and_an_issue_path_keeps_the_segment_whole(
    key: str, lenient: tuple[object, ...]
) -> None:
    assert parse_path(key) is None
    assert split_path(key) == lenient


def test_the_overrides_read_keys_with_the_same_parser() -> None:
    assert overrides_parse_path is parse_path
