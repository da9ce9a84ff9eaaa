"""Typed configs: strict loading, overrides, validation messages."""

import json

import pytest

from wmrl.core.config import ConfigError, apply_overrides, from_dict, load_config, to_dict
from wmrl.core.corrector import CorrectorConfig


def test_round_trip():
    cfg = CorrectorConfig.preset("wmrl_paper_weight", seed=3)
    assert from_dict(CorrectorConfig, to_dict(cfg)) == cfg


def test_unknown_keys_are_rejected_with_their_path():
    with pytest.raises(ConfigError, match=r"debias\.min_pair"):
        from_dict(CorrectorConfig, {"debias": {"min_pair": 3}})
    with pytest.raises(ConfigError, match="unknown config key"):
        from_dict(CorrectorConfig, {"sed": 1})


def test_types_are_checked_not_coerced():
    with pytest.raises(ConfigError, match="integer"):
        from_dict(CorrectorConfig, {"seed": "1"})
    with pytest.raises(ConfigError, match="one of"):
        from_dict(CorrectorConfig, {"fusion": {"mode": "magic"}})
    with pytest.raises(ConfigError, match="fraction"):
        from_dict(CorrectorConfig, {"scheduler": {"fraction": 2.0}})


def test_file_and_overrides(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"seed": 4, "fusion": {"mode": "none"}}))
    cfg = load_config(CorrectorConfig, path, ["scheduler.fraction=0.25", "debias.per_key=true"])
    assert cfg.seed == 4 and cfg.fusion.mode == "none"
    assert cfg.scheduler.fraction == 0.25 and cfg.debias.per_key is True
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        apply_overrides({}, ["oops"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(CorrectorConfig, tmp_path / "missing.json")


def test_a_section_named_in_an_override_keeps_its_parents_defaults():
    """A section given in part keeps the defaults its parent's field gives it (its default factory),
    not the section class's own: the regression was ``model.device=cuda`` turning the warm start's
    base ``smollm2`` into ``smollm2-warm`` (the warm start itself), and ``corrector.scheduler.fraction``
    resetting the domain's calibration defaults to the class's."""
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Inner:
        a: int = 1
        b: int = 2

    @dataclass(frozen=True)
    class Middle:
        inner: Inner = field(default_factory=lambda: Inner(a=10, b=20))
        c: int = 3

    @dataclass(frozen=True)
    class Outer:
        middle: Middle = field(default_factory=lambda: Middle(inner=Inner(a=100, b=200), c=300))
        plain: Inner = field(default_factory=Inner)

    cfg = load_config(Outer, None, ["middle.inner.a=7"])
    assert cfg.middle == Middle(inner=Inner(a=7, b=200), c=300)
    assert load_config(Outer, None, ["middle.c=5"]).middle.inner == Inner(a=100, b=200)
    assert load_config(Outer, None, ["plain.b=9"]).plain == Inner(a=1, b=9)
    assert from_dict(Outer, {}) == Outer()
    # a key that is not a setting is still refused by name, inside a defaulted section too
    with pytest.raises(ConfigError, match=r"middle\.inner\.z"):
        load_config(Outer, None, ["middle.inner.z=1"])


@pytest.mark.trl
def test_domain_sections_keep_their_domain_defaults():
    from wmrl.autoresearch.training.config import QUICKSTART_TASK, TrainConfig
    from wmrl.autoresearch.training.sft import WarmStartConfig

    sft = load_config(WarmStartConfig, None, ["model.device=cuda"])
    assert (sft.model.path, sft.model.device) == ("smollm2", "cuda")
    default = TrainConfig()
    run = load_config(TrainConfig, None, ["corrector.scheduler.fraction=0.25", "tasks.limit=1"])
    assert run.corrector.scheduler.fraction == 0.25
    assert (
        run.corrector.debias == default.corrector.debias and run.corrector.fusion == default.corrector.fusion
    )
    assert run.tasks.ids == (QUICKSTART_TASK,) and run.tasks.limit == 1
    # a setting of another section than the mode's own does not contradict the mode
    real = load_config(TrainConfig, None, ["mode=real", "corrector.debias.min_pairs=4"])
    assert real.corrector.scheduler.fraction == 1.0 and real.corrector.debias.min_pairs == 4


def test_a_choice_named_none_is_reachable_from_the_command_line():
    """`corrector.fusion.mode=none` parsed as null and was refused ("expected Literal")."""
    from wmrl.core.config import apply_overrides, from_dict, to_dict
    from wmrl.core.corrector import CorrectorConfig

    config = from_dict(CorrectorConfig, apply_overrides(to_dict(CorrectorConfig()), ["fusion.mode=none"]))
    assert config.fusion.mode == "none"
    with pytest.raises(ConfigError, match="None is not allowed"):
        from_dict(CorrectorConfig, apply_overrides(to_dict(CorrectorConfig()), ["scheduler.fraction=null"]))


def test_the_word_none_reaches_a_text_setting_that_cannot_be_none():
    """`wmrl eval libero --cameras none` (documented: no camera) was refused: `none` parsed as null."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Cameras:
        cameras: str | tuple[str, ...] = "agentview"
        count: int = 1

    config = from_dict(Cameras, apply_overrides(to_dict(Cameras()), ["cameras=none"]))
    assert config.cameras == "none"
    with pytest.raises(ConfigError, match="None is not allowed"):
        from_dict(Cameras, apply_overrides(to_dict(Cameras()), ["count=none"]))
