"""Issues carry their data, not only their text: the path as a tuple beside the dotted string, and the
fields a message quotes (with the override that set each), so nothing is read back from a message."""

import pickle
from typing import Any

import attrs
import pytest

from hyper_parallel._checks import Quote, quote, rebased, said
from hyper_parallel.config import ConfigError, resolve_root
from hyper_parallel.config.validation import cross_check_errors, problems_of
from hyper_parallel.errors import Issue, format_path, split_path

QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
ADAMW = "hyper_parallel.components.optimizer.AdamW.Config"


def test_a_said_message_is_its_text_and_keeps_its_quotes() -> None:
    message = said("must be <= ", quote("training.max_steps", 10), ", got 200")
    assert message == "must be <= training.max_steps (10), got 200"
    assert message.quotes == (Quote("training.max_steps", 10),)
    assert pickle.loads(pickle.dumps(message)).quotes == message.quotes
    cited = attrs.evolve(quote("parallelism.pp", 2, "pp"), origin="--parallelism.pp")
    assert cited.text() == "pp (2, set by --parallelism.pp)"


def test_quotes_are_rebased_to_the_root_keeping_the_name_the_message_shows() -> None:
    message = rebased(said("must be a multiple of ", quote("micro_batch_size", 3)), "training")
    assert message == "must be a multiple of micro_batch_size (3)"
    assert message.quotes == (Quote("training.micro_batch_size", 3, "micro_batch_size"),)  # type: ignore[attr-defined]
    assert rebased("plain", "training") == "plain"


def test_a_cross_check_message_reaches_the_issue_with_its_quotes_at_root_paths() -> None:
    @attrs.frozen
    class Section:
        a: int = 1
        b: int = 2

        def cross_check(self) -> Any:
            yield "b", said("must exceed ", quote("a", self.a), f", got {self.b}")

    (invalid,) = cross_check_errors(Section())
    (problem,) = problems_of(invalid, ("group", "section"))
    assert problem.path == ("group", "section", "b")
    assert problem.message.quotes == (Quote("group.section.a", 1, "a"),)  # type: ignore[attr-defined]


def test_an_indexed_cross_check_path_keeps_its_index() -> None:
    @attrs.frozen
    class Split:
        def cross_check(self) -> Any:
            yield "pp_layer_split[2]", "must be >= 1"

    (invalid,) = cross_check_errors(Split())
    assert invalid.path == ("pp_layer_split", 2)


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("parallelism.pp_layer_split[2]", ("parallelism", "pp_layer_split", 2)),
        ("x[1][3].y", ("x", 1, 3, "y")),
        ("optimizer", ("optimizer",)),
        ("", ()),
        ("top level", ()),
    ],
)
def test_split_path_reads_back_what_format_path_shows(path: str, parts: tuple[object, ...]) -> None:
    assert split_path(path) == parts
    if parts:
        assert format_path(parts) == path  # type: ignore[arg-type]


def test_an_issue_carries_its_path_as_a_tuple() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root(
            {"model": {"_target_": QWEN}, "optimizer": {"_target_": ADAMW, "no_decay_names": ["b", ""]}}
        )
    (issue,) = info.value.issues
    assert (issue.path, issue.parts) == ("optimizer.no_decay_names[1]", ("optimizer", "no_decay_names", 1))
    assert Issue("a.b[2]", "m").parts == ("a", "b", 2)
    assert Issue("a", "m", parts=("x",)) == Issue("a", "m")  # the tuple is data beside the path, not identity
    assert pickle.loads(pickle.dumps(info.value)).issues[0].parts == issue.parts
