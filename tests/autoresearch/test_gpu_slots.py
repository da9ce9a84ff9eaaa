"""GPUs for the agent's code: a config reaches ``Limits.gpu`` per sandbox slot, two concurrent
executions never share a device, and the agent is told what it has."""

from __future__ import annotations

import pytest

from wmrl.core.config import ConfigError, load_config


def test_gpu_slots_are_validated_and_shown_to_the_agent(tmp_path):
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows
    from wmrl.autoresearch.training.devices import device_groups

    c = load_config(
        TrainConfig, None, ["sandbox.gpus=[0,1,2,3]", "sandbox.gpus_per_slot=2", "sandbox.workers=2"]
    )
    assert c.sandbox.gpu_count == 2 and device_groups(c.sandbox.gpus, 2) == [(0, 1), (2, 3)]
    assert TrainConfig().sandbox.gpu_count == 0
    for bad, message in (
        (["sandbox.gpus=[0,1]", "sandbox.workers=3"], "exceeds"),
        (["sandbox.gpus=[0,1,2]", "sandbox.gpus_per_slot=2"], "split"),
        (["sandbox.gpus=[0,0]"], "distinct"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(TrainConfig, None, bad)
    task = make_toy_task(tmp_path)
    for gpus, shown in ((0, "no GPU"), (1, "a GPU (CUDA)"), (2, "2 GPUs (CUDA)")):
        assert shown in SandboxEnvironment.from_task(task, gpus=gpus).limits_line()
        row = build_prompt_rows([TrainingTask("t", task)], overview_tokens=1500, gpus=gpus)[0]
        assert shown in row["prompt"][0]["content"] and shown in row["prompt"][1]["content"]


def test_each_concurrent_execution_gets_its_own_device(tmp_path):
    """The plain-subprocess backend selects devices through CUDA_VISIBLE_DEVICES, which the script can
    print: every execution saw exactly its slot's device, and overlapping executions saw different ones."""
    import threading

    from wmrl.autoresearch.sandbox import Limits, make_sandbox
    from wmrl.autoresearch.training.devices import DeviceSlots

    data = tmp_path / "data"
    data.mkdir()
    slots = DeviceSlots(make_sandbox("subprocess"), [(0,), (1,)])
    seen = {}

    def run(k):
        code = "import os, time; print('DEV', os.environ.get('CUDA_VISIBLE_DEVICES')); time.sleep(1.0)"
        seen[k] = slots.run(code, data, Limits(wall_time_s=30, memory_mb=512))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(slots.assignments) == 4 and {g for g, _, _ in slots.assignments} == {(0,), (1,)}
    printed = sorted(r.stdout_tail.split("DEV", 1)[1].split()[0] for r in seen.values())
    assert printed == ["0", "0", "1", "1"]
    for i, (g1, s1, e1) in enumerate(slots.assignments):  # overlapping executions hold different devices
        for g2, s2, e2 in slots.assignments[i + 1 :]:
            if s1 < e2 and s2 < e1:
                assert g1 != g2


@pytest.mark.bwrap
def test_the_isolating_backend_receives_the_slot_device(tmp_path):
    import glob

    from wmrl.autoresearch.sandbox import Limits, make_sandbox
    from wmrl.autoresearch.training.devices import DeviceSlots

    data = tmp_path / "data"
    data.mkdir()
    slots = DeviceSlots(make_sandbox("bwrap"), [(3,)])
    if glob.glob("/dev/nvidia3"):
        result = slots.run("print('ok')", data, Limits(wall_time_s=30, memory_mb=256))
        assert result.status == "ok"
    else:  # no such device node here: bubblewrap refuses to pretend it exposed it (unknown, not a failure)
        result = slots.run("print('ok')", data, Limits(wall_time_s=30, memory_mb=256))
        assert result.status == "harness_error" and "GPU" in result.reason
    assert [g for g, _, _ in slots.assignments] == [(3,)]


def test_gpus_the_machine_lacks_are_refused_before_any_execution():
    """A config naming devices this machine does not expose (every index, on a CPU-only machine) is refused
    when the sandbox is built, with the devices it has, rather than turning every anchor into unknown."""
    from wmrl.autoresearch.training.builders import SandboxUnavailable, build_grader
    from wmrl.autoresearch.training.config import SandboxSection
    from wmrl.autoresearch.training.devices import DeviceSlots, missing_gpus, visible_gpus

    assert missing_gpus([0, 1, 2], visible={1}) == [0, 2] and missing_gpus([1], visible={0, 1}) == []
    absent = max(visible_gpus(), default=-1) + 1
    with pytest.raises(SandboxUnavailable, match=rf"GPU\(s\) \[{absent}\].*sandbox.gpus=\[\]"):
        build_grader(SandboxSection(backend="subprocess", gpus=(absent,), workers=1))
    if visible_gpus():  # on a GPU machine the same config with a device it has is accepted, slot by slot
        have = min(visible_gpus())
        grader = build_grader(SandboxSection(backend="subprocess", gpus=(have,), workers=1))
        assert isinstance(grader.sandbox.sandbox, DeviceSlots)


def test_a_ray_pool_gives_its_slots_gpus_through_ray_and_every_execution_asks_for_one():
    """With ``sandbox.pool=ray`` the slots own their GPUs (``ray.gpus_per_slot``): local device lists are
    refused, the agent is told it has a GPU, and each execution asks for one (the slot replaces the ask
    with the ids Ray gave it)."""
    from wmrl.autoresearch.training.config import TrainConfig
    from wmrl.autoresearch.training.devices import RequestGPU

    ray = ["sandbox.pool=ray", "sandbox.backend=subprocess", "sandbox.workers=3", "sandbox.ray.slots=3"]
    with pytest.raises(ConfigError, match=r"ray\.gpus_per_slot"):
        load_config(TrainConfig, None, [*ray, "sandbox.gpus=[0]", "sandbox.workers=1", "sandbox.ray.slots=1"])
    assert load_config(TrainConfig, None, ray).sandbox.gpu_count == 0
    assert load_config(TrainConfig, None, [*ray, "sandbox.ray.gpus_per_slot=0.25"]).sandbox.gpu_count == 1
    assert load_config(TrainConfig, None, [*ray, "sandbox.ray.gpus_per_slot=2"]).sandbox.gpu_count == 2

    class Recorder:
        name = "recorder"

        def run(self, code, data_dir, limits=None):
            self.limits = limits
            return "ran"

    inner = Recorder()
    assert RequestGPU(inner).run("print(1)", ".", None) == "ran" and inner.limits.gpu is True


def test_the_training_grader_runs_each_execution_on_its_slot(tmp_path, monkeypatch):
    """What ``wmrl train autoresearch sandbox.gpus=[0,1]`` builds, end to end on the subprocess backend
    (this machine's missing devices pretended present): the pool takes the slot wrapper (it refused it,
    a TypeError that only a GPU machine reached) and every execution sees its slot's device."""
    from wmrl.autoresearch.sandbox import Limits
    from wmrl.autoresearch.training import devices
    from wmrl.autoresearch.training.builders import build_grader
    from wmrl.autoresearch.training.config import SandboxSection

    monkeypatch.setattr(devices, "missing_gpus", lambda gpus, visible=None: [])
    grader = build_grader(SandboxSection(backend="subprocess", gpus=(0, 1), workers=2, cache=False))
    pool = grader.sandbox
    assert isinstance(pool.sandbox, devices.DeviceSlots)
    data = tmp_path / "data"
    data.mkdir()
    code = "import os; print('DEV', os.environ.get('CUDA_VISIBLE_DEVICES'))"
    try:
        futures = [pool.submit(code, data, Limits(wall_time_s=30, memory_mb=512)) for _ in range(2)]
        results = [f.result(timeout=120) for f in futures]
    finally:
        pool.close()
    assert all(r.status == "ok" for r in results), [r.reason for r in results]
    seen = sorted(r.stdout_tail.split("DEV", 1)[1].split()[0] for r in results)
    assert seen in (["0", "1"], ["0", "0"], ["1", "1"]) and len(pool.sandbox.assignments) == 2


def test_without_a_cgroup_a_gpu_execution_gets_no_address_space_limit(tmp_path):
    """CUDA does not initialise under RLIMIT_AS (it maps far more address space than it uses): the
    GPU check's solution saw its slot's device but ``torch.cuda.is_available()`` False. Without a
    cgroup a GPU execution is bounded by the resident-memory watchdog instead, and says so; a CPU
    execution keeps the address-space limit."""
    from wmrl.autoresearch.sandbox import Limits, make_sandbox

    data = tmp_path / "data"
    data.mkdir()
    sandbox = make_sandbox("subprocess", cgroups=False)
    code = "import resource; print('AS', resource.getrlimit(resource.RLIMIT_AS)[0])"
    seen = {}
    for gpu in (False, (0,)):
        result = sandbox.run(code, data, Limits(wall_time_s=30, memory_mb=512, gpu=gpu))
        assert result.status == "ok", result.reason
        seen[gpu] = int(result.stdout_tail.split("AS", 1)[1].split()[0])
        watchdog_only = any("resident-memory watchdog only" in w for w in result.warnings)
        assert watchdog_only is (gpu is not False)
    assert seen[False] == 512 * 2**20
    assert seen[(0,)] == -1  # RLIM_INFINITY
