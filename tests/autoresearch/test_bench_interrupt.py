"""``wmrl bench autoresearch``: Ctrl-C is exit 130 with one line that says the finished runs are kept."""

import pytest

import wmrl.autoresearch.evaluation.bench as bench
from wmrl.core.cli import main
from wmrl.core.errors import Interrupted


@pytest.mark.parametrize(
    "stop", [KeyboardInterrupt(), Interrupted("checkpoint-2 saved; continue with --resume")]
)
def test_ctrl_c_exits_130_and_says_what_is_kept(tmp_path, monkeypatch, capsys, stop):
    def interrupted(*args, **kwargs):
        raise stop

    monkeypatch.setattr(bench, "run_bench", interrupted)
    assert main(["bench", "autoresearch", "--quick", "--out", str(tmp_path / "b")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "finished runs are kept" in err[0] and str(tmp_path / "b") in err[0]
