"""Late rows appended to a TRL batch: padded as TRL pads, rows with nothing to apply left out, topped up
to TRL's split, the batch's own normaliser untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmrl.core.engines.trl.late_rows import append_rows, keep_rows

PAD = 0


def _batch(n, prompt_w, completion_w, start=1):
    ids = torch.arange(start, start + n * completion_w).reshape(n, completion_w)
    return {
        "prompt_ids": torch.full((n, prompt_w), 7),
        "prompt_mask": torch.ones(n, prompt_w, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": torch.ones(n, completion_w, dtype=torch.long),
        "old_per_token_logps": torch.full((n, completion_w), -1.0),
        "advantages": torch.linspace(-1, 1, n),
        "num_items_in_batch": torch.tensor(float(n * completion_w)),
    }


def test_late_rows_are_padded_filtered_and_topped_up():
    own = _batch(4, prompt_w=3, completion_w=5)
    late_rows = keep_rows(_batch(3, prompt_w=6, completion_w=2, start=100))
    late_adv = np.array([0.5, np.nan, -0.25])
    out = append_rows(dict(own), [(late_rows, late_adv)], PAD, multiple=4)
    assert out["advantages"].shape == (8,)  # 4 own + 2 live late + 2 empty rows to reach a multiple of 4
    np.testing.assert_allclose(out["advantages"][4:6].numpy(), [0.5, -0.25])
    assert (out["advantages"][6:] == 0).all()
    # prompts padded on the left, completions on the right
    assert out["prompt_ids"].shape == (8, 6) and (out["prompt_ids"][:4, :3] == PAD).all()
    assert (out["prompt_mask"][:4, :3] == 0).all() and (out["prompt_mask"][:4, 3:] == 1).all()
    assert out["completion_ids"].shape == (8, 5)
    assert (out["completion_ids"][4, :2] == torch.tensor([100, 101])).all()
    assert (out["completion_ids"][5, :2] == torch.tensor([104, 105])).all()  # the NaN row left out
    assert (out["completion_mask"][4, 2:] == 0).all()
    # the empty rows train nothing; the own rows keep their mask
    assert (out["tool_mask"][6:] == 0).all() and (out["tool_mask"][:6].sum(1) > 0).all()
    assert out["num_items_in_batch"] == own["num_items_in_batch"]


def test_nothing_to_apply_leaves_the_batch_as_it_was():
    own = _batch(2, 3, 4)
    out = append_rows(dict(own), [(keep_rows(_batch(2, 3, 4)), np.array([np.nan, np.nan]))], PAD, multiple=2)
    assert out["advantages"].shape == (2,) and out["completion_ids"].shape == (2, 4)


def test_a_batch_with_images_cannot_keep_its_rows():
    batch = _batch(2, 3, 4)
    batch["pixel_values"] = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="pixel_values"):
        keep_rows(batch)


def test_every_rank_is_padded_to_the_same_row_count():
    """A rank with fewer late rows (or none) is topped up with empty, fully masked rows to ``rows``."""
    own = _batch(4, prompt_w=3, completion_w=5)
    bare = append_rows(dict(own), [], PAD, multiple=4, total_rows=8)  # no late rows here, 6 on another rank
    assert bare["advantages"].shape == (8,) and (bare["advantages"][4:] == 0).all()
    assert (bare["tool_mask"][4:] == 0).all() and (bare["tool_mask"][:4] == 1).all()
    assert (bare["completion_ids"][4:] == PAD).all()
    assert torch.equal(bare["num_items_in_batch"], own["num_items_in_batch"])
    late = keep_rows(_batch(2, prompt_w=3, completion_w=5, start=50))
    some = append_rows(dict(own), [(late, np.array([0.3, 0.1]))], PAD, multiple=4, total_rows=12)
    assert some["advantages"].shape == (12,) and (some["tool_mask"][6:] == 0).all()
    assert (some["tool_mask"][4:6] == 1).all()
    with pytest.raises(ValueError, match="at least 8"):
        append_rows(dict(own), [(late, np.array([0.3, 0.1]))], PAD, multiple=4, total_rows=4)
    with pytest.raises(ValueError, match="multiple of 4"):
        append_rows(dict(own), [], PAD, multiple=4, total_rows=6)
