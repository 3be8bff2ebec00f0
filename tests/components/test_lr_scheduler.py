"""LRScheduler.Config.build(optimizer, training_steps): warmup then linear/cosine/constant decay."""

import math

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.lr_scheduler import LRScheduler, WarmupDecay  # noqa: E402

PEAK = 0.01


def lrs(cfg: WarmupDecay.Config, steps: int, extra: int = 0) -> list[float]:
    """Learning rate used by optimizer step s (s = 0 .. steps + extra - 1)."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=PEAK)
    sched = cfg.build(opt, steps)
    seen = []
    for _ in range(steps + extra):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


@pytest.mark.parametrize("min_lr_factor", [0.0, 0.1])
def test_cosine_closed_form(min_lr_factor: float) -> None:
    # 100 steps, 10 warmup: decay over steps 10..99 (90 steps), progress (s - 10) / 89.
    m = min_lr_factor
    got = lrs(WarmupDecay.Config(warmup_steps=10, decay_type="cosine", min_lr_factor=m), 100)
    assert got[0] == pytest.approx(PEAK * 1 / 11)
    assert got[9] == pytest.approx(PEAK * 10 / 11)  # last warmup step
    assert got[10] == pytest.approx(PEAK)  # end of warmup: the peak
    mid = 10 + 89 / 2  # halfway through the decay: cos(pi / 2) = 0
    assert mid == 54.5
    expected_54 = m + (1 - m) * 0.5 * (1 + math.cos(math.pi * 44 / 89))
    assert got[54] == pytest.approx(PEAK * expected_54)
    assert (got[54] + got[55]) / 2 == pytest.approx(PEAK * (m + (1 - m) * 0.5), rel=1e-3)
    assert got[99] == pytest.approx(PEAK * m, abs=1e-15)  # last step: the minimum


def test_linear_closed_form() -> None:
    got = lrs(WarmupDecay.Config(warmup_steps=4, decay_type="linear", min_lr_factor=0.2), 25)
    assert got[:5] == pytest.approx([PEAK * k / 5 for k in (1, 2, 3, 4)] + [PEAK])
    # Decay over s = 4..24 (21 steps): factor 0.2 + 0.8 * (1 - (s - 4) / 20).
    assert got[14] == pytest.approx(PEAK * (0.2 + 0.8 * 0.5))  # midway
    assert got[24] == pytest.approx(PEAK * 0.2)
    for s in range(4, 25):
        assert got[s] == pytest.approx(PEAK * (0.2 + 0.8 * (1 - (s - 4) / 20)))


def test_constant_keeps_the_peak_after_warmup() -> None:
    got = lrs(WarmupDecay.Config(warmup_steps=3, decay_type="constant", min_lr_factor=0.5), 10)
    assert got == pytest.approx([PEAK / 4, PEAK / 2, PEAK * 3 / 4] + [PEAK] * 7)


def test_decay_ratio_adds_a_plateau() -> None:
    # 20 steps, 2 warmup, decay_ratio 0.5: plateau s = 2..9, decay s = 10..19.
    cfg = WarmupDecay.Config(warmup_steps=2, decay_type="linear", decay_ratio=0.5, min_lr_factor=0.0)
    got = lrs(cfg, 20)
    assert got[:2] == pytest.approx([PEAK / 3, PEAK * 2 / 3])
    assert got[2:11] == pytest.approx([PEAK] * 9)
    assert got[11] == pytest.approx(PEAK * (1 - 1 / 9))
    assert got[19] == pytest.approx(0.0, abs=1e-15)


def test_no_warmup_starts_at_the_peak_and_stays_at_the_minimum_afterwards() -> None:
    got = lrs(WarmupDecay.Config(warmup_steps=0, decay_type="cosine", min_lr_factor=0.3), 5, extra=3)
    assert got[0] == pytest.approx(PEAK)
    assert got[4:] == pytest.approx([PEAK * 0.3] * 4)


def test_every_param_group_is_scaled_from_its_own_lr() -> None:
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 0.5}])
    WarmupDecay.Config(warmup_steps=1).build(opt, 4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.25])


def test_state_dict_round_trip_resumes_the_schedule() -> None:
    cfg = WarmupDecay.Config(warmup_steps=2, decay_type="cosine")
    p1 = torch.nn.Parameter(torch.zeros(1))
    opt1 = torch.optim.SGD([p1], lr=PEAK)
    s1 = cfg.build(opt1, 10)
    for _ in range(4):
        opt1.step()
        s1.step()
    p2 = torch.nn.Parameter(torch.zeros(1))
    opt2 = torch.optim.SGD([p2], lr=PEAK)
    s2 = cfg.build(opt2, 10)
    s2.load_state_dict(s1.state_dict())
    assert s2.get_last_lr() == s1.get_last_lr()
    s1.step()
    s2.step()
    assert s2.get_last_lr() == pytest.approx(s1.get_last_lr())


def test_state_dict_is_the_position_alone() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = WarmupDecay.Config(warmup_steps=2).build(opt, 10)
    for _ in range(3):
        opt.step()
        sched.step()
    assert sched.state_dict() == {"step": 3}


@pytest.mark.parametrize(
    ("old", "new", "old_steps", "new_steps", "new_peak"),
    [
        pytest.param({}, {}, 10, 40, PEAK, id="longer-run"),
        pytest.param({}, {"warmup_steps": 6, "decay_type": "linear"}, 10, 10, PEAK, id="other-shape"),
        pytest.param({}, {}, 10, 10, 3 * PEAK, id="other-peak-lr"),
    ],
)
def test_resume_follows_the_current_schedule_from_the_saved_step(
    old: dict[str, object], new: dict[str, object], old_steps: int, new_steps: int, new_peak: float
) -> None:
    # Save at step 4 of the old schedule, resume into a scheduler built from the new config: every
    # later lr equals the new schedule's, as if the run had used the new config from the start.
    opt1 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    s1 = WarmupDecay.Config(**{"warmup_steps": 2, **old}).build(opt1, old_steps)  # type: ignore[arg-type]
    for _ in range(4):
        opt1.step()
        s1.step()
    new_cfg = WarmupDecay.Config(**{"warmup_steps": 2, **new})  # type: ignore[arg-type]
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=new_peak)
    s2 = new_cfg.build(opt2, new_steps)
    opt2.load_state_dict(opt1.state_dict())  # restores the old schedule's lr (the order of a resume)
    s2.load_state_dict(s1.state_dict())
    expected = [new_peak / PEAK * lr for lr in lrs(new_cfg, new_steps)]
    got = []
    for _ in range(4, new_steps):
        got.append(opt2.param_groups[0]["lr"])
        assert s2.get_last_lr() == [got[-1]]
        opt2.step()
        s2.step()
    assert got == pytest.approx(expected[4:], rel=1e-12)
    assert s2.last_epoch == new_steps


@pytest.mark.parametrize("state", [{}, {"step": -1}, {"step": "3"}, {"last_epoch": 3}])
def test_a_state_without_a_step_is_refused(state: dict[str, object]) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = WarmupDecay.Config(warmup_steps=2).build(opt, 10)
    with pytest.raises(ValueError, match=r"lr scheduler state needs a step >= 0, got "):
        sched.load_state_dict(state)


def test_a_schedule_longer_than_the_run_keeps_its_warmup_and_shortens_the_decay() -> None:
    # The config layer warns about both; the run follows the warmup and gives the decay the steps left.
    assert lrs(WarmupDecay.Config(warmup_steps=20), 10) == pytest.approx(
        [PEAK * (s + 1) / 21 for s in range(10)]
    )
    cfg = WarmupDecay.Config(warmup_steps=8, decay_ratio=0.5, decay_type="linear", min_lr_factor=0.1)
    assert lrs(cfg, 10) == pytest.approx([*(PEAK * (s + 1) / 9 for s in range(8)), PEAK, 0.1 * PEAK])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(ValueError, match="training_steps must be >= 1"):
        WarmupDecay.Config(warmup_steps=0).build(opt, 0)


def test_base_config_names_the_class() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(NotImplementedError, match=r"LRScheduler\.Config"):
        LRScheduler.Config().build(opt, 10)


def test_the_default_schedule_trains_its_last_step_at_a_tenth_of_the_peak() -> None:
    # A last step at learning rate 0 is a step paid for and wasted (issue 35): the default decays to 0.1x.
    for decay_type in ("linear", "cosine"):
        got = lrs(WarmupDecay.Config(warmup_steps=2, decay_type=decay_type), 12)  # type: ignore[arg-type]
        assert got[-1] == pytest.approx(0.1 * PEAK)
        assert min(got) == pytest.approx(0.1 * PEAK)
