"""The Robometer trainer (``wmrl train embodied-wm``): labels, losses, fidelity, and that it learns.

The learning test uses synthetic episodes whose outcome is visible: a bright square slides from the
left edge towards the right one in a success, and barely moves in a failure. A trained model must rank held-out successes above failures; the random tiny model it
starts from does not, so the test fails if training does nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wmrl.core.config import ConfigError
from wmrl.core.rundir import STAGE_FILE, RunDirectory
from wmrl.embodied.worldmodel.fidelity import auroc, bootstrap_auroc, fidelity_report
from wmrl.embodied.worldmodel.frames import subsample_indices
from wmrl.embodied.worldmodel.robometer_model import bins_to_progress
from wmrl.embodied.worldmodel.train_config import WorldModelTrainConfig, load_wm_config
from wmrl.embodied.worldmodel.training import train_world_model, two_hot, window_labels

pytest.importorskip("h5py")
pytest.importorskip("transformers")

INSTRUCTION = "push the square to the right"


# -- labels and losses, closed form -------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.05, 0.37, 0.5, 0.999, 1.0])
def test_two_hot_mean_is_the_label_and_mass_is_one(p):
    target = two_hot(torch.tensor([p]), 10)[0]
    centres = torch.linspace(0, 1, 10)
    assert float(target.sum()) == pytest.approx(1.0)
    assert float((target * centres).sum()) == pytest.approx(p, abs=1e-6)
    assert int((target > 0).sum()) <= 2
    # the log of the two-hot target, as logits, reads back the label through the softmax expectation
    logits = torch.log(target.clamp_min(1e-12))
    assert float(bins_to_progress(logits)) == pytest.approx(p, abs=1e-5)


def test_window_labels_of_a_whole_success():
    idx, progress, success = window_labels(length=101, success=True, end=101, k=8)
    assert list(idx) == list(subsample_indices(101, 8))
    assert idx[-1] == 100
    np.testing.assert_allclose(progress, idx / 100)
    assert list(success) == [0, 0, 0, 0, 0, 0, 0, 1]


def test_window_labels_of_a_prefix_and_of_a_failure():
    idx, progress, success = window_labels(length=101, success=True, end=51, k=8)
    assert idx[-1] == 50 and progress[-1] == pytest.approx(0.5)
    assert success.sum() == 0  # an unfinished success is not a success
    idx, progress, success = window_labels(length=101, success=False, end=101, k=8)
    assert progress is None and success.sum() == 0
    with pytest.raises(ValueError):
        window_labels(length=10, success=True, end=11, k=8)


def test_auroc_matches_its_definition_and_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    labels = rng.random(40) < 0.4
    scores = np.round(rng.random(40) + 0.5 * labels, 1)  # rounded: ties occur
    assert auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    assert auroc([0.1, 0.9], [False, True]) == 1.0
    assert auroc([0.5, 0.5], [False, True]) == 0.5
    assert auroc([0.1, 0.2], [True, True]) is None
    low, high = bootstrap_auroc(scores, labels, 200, seed=0)
    assert low <= auroc(scores, labels) <= high


def test_fidelity_report_counts_unscored_apart():
    scores = [
        {"potential": 0.9, "final": 0.9, "max": 0.9, "success": 0.8},
        None,
        {"potential": 0.1, "final": 0.2, "max": 0.3, "success": 0.1},
    ]
    report = fidelity_report(scores, [True, True, False], resamples=0)
    assert report["unscored"] == 1 and report["successes"] == 1 and report["failures"] == 1
    assert report["modes"]["success"]["accuracy"] == 1.0
    assert report["modes"]["potential"]["auroc"] == 1.0
    assert report["modes"]["potential"]["auroc_interval"] is None


def test_config_refuses_bad_settings():
    with pytest.raises(ConfigError):
        WorldModelTrainConfig(min_window=0)
    with pytest.raises(ConfigError):
        WorldModelTrainConfig(progress_weight=0, success_weight=0)
    with pytest.raises(ConfigError):
        WorldModelTrainConfig(num_frames=1)
    assert load_wm_config("smoke", ["epochs=3"]).epochs == 3


# -- it learns -------------------------------------------------------------------------------------
def _episode(length: int, success: bool, rng: np.random.Generator) -> np.ndarray:
    frames = np.full((length, 64, 64, 3), 40, dtype=np.uint8)
    frames += rng.integers(0, 20, size=frames.shape, dtype=np.uint8)
    reach = 48 if success else 4
    for t in range(length):
        x = round(reach * t / (length - 1))
        frames[t, 24:40, x : x + 16] = 230
    return frames


def _write(path, n_success: int, n_failure: int, seed: int):
    from wmrl.embodied.demos.libero_hdf5 import write_libero_hdf5
    from wmrl.embodied.demos.types import Demo

    rng = np.random.default_rng(seed)
    demos = []
    for i in range(n_success + n_failure):
        length = int(rng.integers(14, 22))
        demos.append(
            Demo(
                instruction=INSTRUCTION,
                actions=np.zeros((length, 7), np.float32),
                frames={"agentview": _episode(length, i < n_success, rng)},
                orientation="upright",
                success=i < n_success,
                name=f"demo_{i}",
            )
        )
    return write_libero_hdf5(path, demos)


def test_training_separates_held_out_successes_from_failures(tmp_path):
    train = _write(tmp_path / "train" / "t_demo.hdf5", 8, 8, seed=0)
    held = _write(tmp_path / "held" / "t_demo.hdf5", 6, 6, seed=1)
    config = WorldModelTrainConfig(
        paths=(str(train),),
        held_out=(str(held),),
        epochs=14,
        windows_per_episode=4,
        batch_size=8,
        learning_rate=6e-3,
        bootstrap=50,
        torch_threads=2,
    )
    run = RunDirectory(tmp_path / "run", marker=STAGE_FILE)
    summary = train_world_model(config, run, progress=False)
    held_report = summary["fidelity"]["held_out"]
    assert held_report["unscored"] == 0 and held_report["successes"] == 6
    # potential (the RL default) reads the climb of progress, which only the images carry
    assert held_report["modes"]["potential"]["auroc"] >= 0.9, held_report["modes"]
    potential = held_report["modes"]["potential"]
    assert potential["mean_success"] > potential["mean_failure"] + 0.05
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["wm/loss"] < metrics[0]["wm/loss"]
    for name in ("config.json", "resolved.json", "fidelity.json", "plots/fidelity-held_out.png"):
        assert (tmp_path / "run" / name).is_file(), name
    # the saved model is what the RL reward source loads, and scores as the trained one did
    from wmrl.embodied.sources import RobometerSourceConfig, make_robometer_source

    source = make_robometer_source(RobometerSourceConfig(model_path=summary["model"]))
    assert source.backend.config.n_bins == 10
    # wmrl embodied wm-fidelity measures the saved checkpoint on the same episodes to the same report
    from wmrl.core.cli import main

    out = tmp_path / "fidelity.json"
    command = ["embodied", "wm-fidelity", "--model", summary["model"], "--episodes", str(held.parent)]
    assert main([*command, "--bootstrap", "50", "--out", str(out)]) == 0
    measured = json.loads(out.read_text())
    assert measured["modes"] == json.loads(json.dumps(held_report["modes"]))
    assert main([*command, "--num-frames", "1"]) == 2
    assert main(["embodied", "wm-fidelity", "--tiny", "--episodes", str(tmp_path / "absent")]) == 2


def test_resume_is_refused(tmp_path):
    train = _write(tmp_path / "t_demo.hdf5", 1, 1, seed=0)
    run = RunDirectory(tmp_path / "run", resume=True, marker=STAGE_FILE)
    with pytest.raises(ValueError, match="no mid-run checkpoint"):
        train_world_model(WorldModelTrainConfig(paths=(str(train),)), run, progress=False)


def test_no_success_is_refused(tmp_path):
    train = _write(tmp_path / "t_demo.hdf5", 0, 2, seed=0)
    with pytest.raises(ValueError, match="no successful episode"):
        train_world_model(
            WorldModelTrainConfig(paths=(str(train),)),
            RunDirectory(tmp_path / "run", marker=STAGE_FILE),
            progress=False,
        )


def test_a_tiny_model_with_small_patches_saves_and_loads_with_its_preprocessing(tmp_path):
    from wmrl.embodied.worldmodel.robometer import Robometer

    model = Robometer.tiny(seed=1, patch_size=8)
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 64, 64, 3), dtype=np.uint8)
    inputs = model.processor.encode([(frames, INSTRUCTION)])
    assert inputs["pixel_values"].shape == (8 * 8 * 8, 3 * 2 * 8 * 8)  # 8x8 patches of 8 px per frame
    model.save_pretrained(tmp_path / "m")
    loaded = Robometer.from_pretrained(tmp_path / "m")
    assert loaded.config.image.patch_size == 8
    np.testing.assert_allclose(
        loaded.predict([(frames, INSTRUCTION)])[0].progress,
        model.predict([(frames, INSTRUCTION)])[0].progress,
    )
    with pytest.raises(ConfigError, match="patch_size"):
        WorldModelTrainConfig(init="some/folder", patch_size=8)
