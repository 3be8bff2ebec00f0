"""Tokenizer.Config.build(weights_path): a local tokenizer.json through the tokenizers library."""

from pathlib import Path

import pytest

from hyper_parallel.errors import InputFileError

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer, Tokenizer
from tests.support.components import train_tokenizer


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return train_tokenizer(tmp_path / "tok")


def test_encode_decode_and_special_ids_from_tokenizer_config(folder: Path) -> None:
    tok = HuggingFaceTokenizer.Config(path=str(folder)).build()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    ids = tok.encode("the lazy dog")
    assert ids[0] == 1
    assert ids[-1] == 2
    assert len(ids) == 5
    assert tok.decode(ids, skip_special_tokens=True) == "the lazy dog"
    assert tok.decode(ids) == "<s> the lazy dog </s>"
    assert tok.vocab_size == 4 + 14


def test_add_bos_and_add_eos_flags(folder: Path) -> None:
    plain = HuggingFaceTokenizer.Config(path=str(folder), add_bos=False, add_eos=False).build()
    full = HuggingFaceTokenizer.Config(path=str(folder)).build()
    assert full.encode("quick fox") == [1, *plain.encode("quick fox"), 2]
    assert plain.encode_batch(["quick fox", "dog"]) == [plain.encode("quick fox"), plain.encode("dog")]
    assert full.encode_batch(["dog"]) == [full.encode("dog")]


def test_path_may_name_the_file(folder: Path) -> None:
    tok = HuggingFaceTokenizer.Config(path=str(folder / "tokenizer.json")).build()
    assert tok.eos_id == 2


def test_null_path_falls_back_to_weights_path(folder: Path) -> None:
    tok = HuggingFaceTokenizer.Config().build(weights_path=str(folder))
    assert tok.encode("fox", add_bos=False) == [tok.encode("fox", add_bos=False, add_eos=False)[0], 2]
    with pytest.raises(ValueError, match="no weights_path"):
        HuggingFaceTokenizer.Config().build()


def test_config_tokens_override_and_pad_falls_back_to_eos(tmp_path: Path) -> None:
    folder = train_tokenizer(tmp_path / "bare", with_config=False)
    bare = HuggingFaceTokenizer.Config(path=str(folder)).build()
    assert (bare.bos_id, bare.eos_id, bare.pad_id) == (None, None, None)
    assert bare.encode("dog") == bare.encode("dog", add_bos=False, add_eos=False)  # nothing to add
    tok = HuggingFaceTokenizer.Config(path=str(folder), bos_token="<pad>", eos_token="<s>").build()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (3, 1, 1)


def test_pad_follows_padding_side(folder: Path) -> None:
    right = HuggingFaceTokenizer.Config(path=str(folder)).build()
    left = HuggingFaceTokenizer.Config(path=str(folder), padding_side="left").build()
    assert right.pad([7, 8], 4) == [7, 8, 3, 3]
    assert left.pad([7, 8], 4) == [3, 3, 7, 8]
    assert right.pad([7, 8, 9], 2) == [7, 8]


def test_model_max_length(folder: Path) -> None:
    assert HuggingFaceTokenizer.Config(path=str(folder)).build().model_max_length is None
    assert HuggingFaceTokenizer.Config(path=str(folder), model_max_length=64).build().model_max_length == 64


def test_unknown_special_token_and_missing_file_are_errors(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="eos_token '<eot>' is not in the tokenizer's vocabulary"):
        HuggingFaceTokenizer.Config(path=str(folder), eos_token="<eot>").build()
    with pytest.raises(
        ValueError, match=r"nowhere: no tokenizer file here \(expected a local tokenizer\.json\)"
    ):
        HuggingFaceTokenizer.Config(path=str(tmp_path / "nowhere")).build()


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Tokenizer\.Config"):
        Tokenizer.Config().build()


# ByteTokenizer: no files, UTF-8 bytes then BOS, EOS, PAD.


def test_byte_tokenizer_round_trips_utf8_with_special_ids() -> None:
    tok = ByteTokenizer.Config().build()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (256, 257, 258)
    assert tok.vocab_size == ByteTokenizer.Config().vocab_size() == 259
    text = "naïve café ✓"
    ids = tok.encode(text)
    assert ids == [256, *text.encode("utf-8"), 257]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == f"<s>{text}</s>"
    assert tok.encode_batch(["a", "é"]) == [[256, 97, 257], [256, 0xC3, 0xA9, 257]]
    assert tok.pad([1, 2], 4) == [1, 2, 258, 258]
    assert (tok.padding_side, tok.model_max_length) == ("right", None)


def test_byte_tokenizer_flags_and_errors() -> None:
    plain = ByteTokenizer.Config(add_bos=False, add_eos=False).build(weights_path="/ignored")
    assert plain.encode("ab") == [97, 98]
    assert plain.encode("ab", add_eos=True) == [97, 98, 257]
    assert plain.decode([0xC3]) == "\ufffd"  # a cut multi-byte character does not raise
    with pytest.raises(ValueError, match=r"token id 300 is outside the byte vocabulary \[0, 259\)"):
        plain.decode([300])


@pytest.mark.parametrize(
    ("cfg", "vocab", "needs_files"),
    [
        (ByteTokenizer.Config(), 259, False),
        (HuggingFaceTokenizer.Config(), None, True),
        (HuggingFaceTokenizer.Config(path="/x"), None, True),
        (Tokenizer.Config(), None, True),
    ],
)
def test_vocab_size_and_needs_files_are_known_without_reading(
    cfg: Tokenizer.Config, vocab: int | None, needs_files: bool
) -> None:
    assert cfg.vocab_size() == vocab
    assert cfg.needs_files() is needs_files


def test_a_hugging_face_tokenizer_exports_its_files_with_the_config_overrides(folder: Path) -> None:
    import json

    from hyper_parallel.components.tokenizer._export import tokenizer_files
    from hyper_parallel.components.tokenizer.chat_templates import builtin_template

    cfg = HuggingFaceTokenizer.Config(path=str(folder), eos_token="<pad>", model_max_length=64)
    files = tokenizer_files(cfg, None)
    assert sorted(files) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    copy = json.loads(files["tokenizer.json"])  # the file, with a post-processor adding BOS as training did
    assert copy["post_processor"]["single"][0] == {"SpecialToken": {"id": "<s>", "type_id": 0}}
    assert {**copy, "post_processor": None} == json.loads((folder / "tokenizer.json").read_bytes())
    config = json.loads(files["tokenizer_config.json"])
    assert config == {
        "bos_token": "<s>",
        "eos_token": "<pad>",
        "pad_token": "<pad>",
        "model_max_length": 64,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": builtin_template(add_bos=True),  # the one training used: it has none of its own
    }
    assert json.loads(files["special_tokens_map.json"]) == {
        "bos_token": "<s>",
        "eos_token": "<pad>",
        "pad_token": "<pad>",
    }
    out = folder.parent / "exported"
    out.mkdir()
    for name, content in files.items():
        (out / name).write_bytes(content)
    again = HuggingFaceTokenizer.Config(path=str(out)).build()  # the folder alone encodes as configured
    built = cfg.build()
    assert (again.bos_id, again.eos_id, again.pad_id, again.model_max_length) == (
        built.bos_id,
        built.eos_id,
        built.pad_id,
        64,
    )
    assert again.encode("the lazy dog") == built.encode("the lazy dog")


def test_exporting_a_missing_hugging_face_tokenizer_names_the_path(tmp_path: Path) -> None:
    from hyper_parallel.components.tokenizer._export import tokenizer_files

    missing = tmp_path / "gone"
    with pytest.raises(InputFileError) as caught:
        tokenizer_files(HuggingFaceTokenizer.Config(path=str(missing)), None)
    assert str(caught.value) == f"{missing}: no tokenizer file here (expected a local tokenizer.json)"


@pytest.mark.parametrize(("add_bos", "add_eos"), [(True, True), (True, False), (False, True), (False, False)])
def test_encode_batch_flat_is_encode_batch_end_to_end(folder: Path, add_bos: bool, add_eos: bool) -> None:
    import numpy as np

    texts = ["the lazy dog", "", "quick fox", "dog"]
    for tok in (
        HuggingFaceTokenizer.Config(path=str(folder), add_bos=add_bos, add_eos=add_eos).build(),
        ByteTokenizer.Config(add_bos=add_bos, add_eos=add_eos).build(),
    ):
        ids, lengths = tok.encode_batch_flat(texts, np.dtype(np.uint16))
        expected = tok.encode_batch(texts)
        assert (ids.dtype, lengths.dtype) == (np.uint16, np.int64)
        assert lengths.tolist() == [len(e) for e in expected]
        assert ids.tolist() == [t for e in expected for t in e]
        assert [a.tolist() for a in tok.encode_batch_flat([], np.dtype(np.uint16))] == [[], []]


def test_a_pickled_tokenizer_keeps_split_special_tokens(folder: Path) -> None:
    # prepare's workers receive the main process's tokenizer pickled; the library's pickle drops the switch.
    import json
    import pickle

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": True}))
    tok = HuggingFaceTokenizer.Config(path=str(folder), add_bos=False, add_eos=False).build()
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.encode("dog </s>") == tok.encode("dog </s>")
    assert tok.eos_id not in tok.encode("dog </s>")
