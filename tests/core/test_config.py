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
