"""``close_process_group``: leaves whatever process group is open (started by us or by a library's
launcher) and is a no-op when none is; ``Processes.close`` of a single process touches nothing."""

from __future__ import annotations

import pytest

dist = pytest.importorskip("torch.distributed")

from wmrl.core.distributed import Processes, close_process_group  # noqa: E402


@pytest.mark.parametrize("barrier", [False, True])
def test_an_open_group_is_closed_and_a_second_call_does_nothing(tmp_path, barrier):
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    close_process_group(barrier=barrier)
    assert not dist.is_initialized()
    close_process_group(barrier=barrier)  # none open: nothing to do, no error
    assert not dist.is_initialized()


def test_a_single_process_never_touches_torch_distributed():
    Processes().close()
    assert not dist.is_initialized()
