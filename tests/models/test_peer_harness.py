"""``bench.peers.harness``: one timing loop for ours and every peer, its statistics, and the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers.harness import Setting, Timing, plan, time_steps

torch = pytest.importorskip("torch")


class _FakeClock:
    """A clock that only the fake step moves: step ``i`` lasts ``durations[i]`` seconds."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = iter(durations)
        self.steps = 0
        self.syncs = 0

    def step(self) -> None:
        self.steps += 1
        self.now += next(self.durations)

    def sync(self) -> None:
        self.syncs += 1


def test_the_timed_steps_exclude_warm_up_and_report_median_and_spread() -> None:
    clock = _FakeClock([100.0, 50.0] + [float(n) for n in (7, 1, 10, 3, 5, 2, 9, 4, 8, 6)])
    timing = time_steps(clock.step, warmup=2, steps=10, sync=clock.sync, clock=lambda: clock.now)
    assert clock.steps == 12
    assert clock.syncs == 11  # once after the warm-up, then after every timed step
    assert timing.samples == (7.0, 1.0, 10.0, 3.0, 5.0, 2.0, 9.0, 4.0, 8.0, 6.0)
    assert (timing.median, timing.minimum, timing.maximum) == (5.5, 1.0, 10.0)
    assert timing.iqr == 8.25 - 2.75  # the exclusive quartiles of 1..10


def test_fewer_than_ten_timed_steps_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^steps: 9 timed steps; a median and spread need at least 10$"):
        time_steps(lambda: None, warmup=0, steps=9, sync=lambda: None)


def test_a_timing_of_equal_steps_has_no_spread() -> None:
    timing = Timing((0.5,) * 10)
    assert (timing.median, timing.minimum, timing.maximum, timing.iqr) == (0.5, 0.5, 0.5, 0.0)


def test_every_peer_is_timed_eager_and_on_cuda_compiled_too() -> None:
    peers = ["ours", "ours_hf", "hf_loop", "transformers", "liger", "torchtitan"]
    eager = [(peer, False) for peer in peers]
    assert plan(tiny=True, cuda=True) == eager
    assert plan(tiny=False, cuda=False) == eager
    assert plan(tiny=False, cuda=True) == eager + [(peer, True) for peer, _ in eager]


@pytest.mark.parametrize(("tiny", "parameters"), [(True, 155_968), (False, 1_235_814_400)])
def test_transformers_llama_is_tied_with_our_parameter_count(tiny: bool, parameters: int) -> None:
    pytest.importorskip("transformers")
    from bench.peers.llama_peers import our_config, transformers_llama

    model = our_config(Setting(tiny, False, 64, 2, 1, 10)).model
    args = model.args
    assert args.tie_word_embeddings
    ours = model.build_model_fn(args, device="meta")
    with torch.device("meta"):
        theirs = transformers_llama(args)
    assert theirs.lm_head.weight is theirs.model.embed_tokens.weight
    assert sum(p.numel() for p in ours.parameters()) == parameters
    assert sum(p.numel() for p in theirs.parameters()) == parameters


@pytest.mark.parametrize(("tiny", "parameters"), [(True, 155_968), (False, 1_235_814_400)])
def test_the_transformers_path_row_trains_our_config_on_the_folder_of_its_shape(
    tmp_path: Path, tiny: bool, parameters: int
) -> None:
    """``ours_hf`` and ``hf_loop`` read one ``config.json`` of our shape, tied: the same parameter count as
    ours; everything but the model section is our config's."""
    pytest.importorskip("transformers")
    from bench.peers.llama_peers import our_config, write_hf_folder

    setting = Setting(tiny, False, 64, 2, 1, 10)
    write_hf_folder(setting, tmp_path)
    ours, hf = our_config(setting), our_config(setting, tmp_path)
    assert (hf.model.name, hf.model.weights_path) == ("hf", None)  # init: random, nothing read
    config = hf.model.args.config()
    assert (config["architectures"], config["tie_word_embeddings"]) == (["LlamaForCausalLM"], True)
    built = hf.model.build_model_fn(hf.model.args, device="meta")
    assert type(built.causal_lm).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in built.parameters()) == parameters
    assert hf.training == ours.training
    assert (hf.optimizer, hf.lr_scheduler, hf.dataloader) == (
        ours.optimizer,
        ours.lr_scheduler,
        ours.dataloader,
    )
