"""Issue 13 on a GPU: the warm start, the three modes and their evaluations, with the real LM.

Check ``real_lm`` of ``benchmarks/gpu_check.py``. Every stage is the ``wmrl`` command a user runs
on a CPU, with ``model.device=cuda`` (bf16) and a batch a GPU can take:

1. ``wmrl train autoresearch-sft``: the warm start's recipe (3 LoRA epochs over the training tasks'
   executed baseline scripts) on the GPU;
2. ``wmrl train autoresearch`` from it in the modes ``real``, ``world_model`` and ``wmrl``, side by
   side on the one GPU (same seed, tasks, batch and learning rate). A wall-clock phase, not a step
   count, bounds them: at its end each run still going gets Ctrl-C (SIGINT: it finishes its step
   and checkpoints, exit 130) and is then closed at the step it reached by ``--resume steps=N``,
   which writes its final policy, plots and summary as for any finished run;
3. ``wmrl eval autoresearch`` of the warm start (beside the GRPO phase) and of every run's last
   checkpoint as soon as the run ends (beside its closing): in-sample on the training tasks (did
   the reward rise where it was trained?) and on the held-out tasks.

Each stage's command line, exit code, wall time and log tail go into the returned dict; the run
and evaluation folders stay under ``work`` (``gpu_check.py`` packs their small files).
``Plan.rehearsal()`` is the same pipeline sized for a CPU, to try it before a GPU session.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

#: The script action's quickstart tasks (``wmrl train autoresearch``'s embedded default until 2026-12-05).
QUICKSTART_TASKS = ("penguin-body-mass", "breast-cancer-diagnosis")


@dataclass(frozen=True)
class Plan:
    """What the check runs, and how the wall-clock budget is shared between its stages.

    Attributes:
        device / dtype: where and in what precision the models run.
        backend / sandbox_workers: real execution (each process's concurrent executions).
        modes: the GRPO runs, side by side, one per mode and seed.
        seeds: the training seeds of every mode (runs are named ``<mode>`` for one seed,
            ``<mode>-s<seed>`` for several).
        variants: further runs beside them, by name: ``wmrl train autoresearch`` settings appended
            to the plan's (a later setting wins), e.g. the CPU quickstart's own batch; they are
            evaluated in-sample only.
        steps: upper bound on GRPO steps (the training phase's deadline usually ends them first).
        groups_per_step / group_size / prompts_per_task: a step's batch (8 x 8 = 64 rollouts).
        learning_rate: LoRA learning rate of every run.
        anchor_fraction: share of ``wmrl``'s groups executed for real each step.
        micro_batch_size: rollouts per forward/backward pass of the update.
        wm_batch_size: world-model prompts per scoring call.
        max_new_tokens: tokens per reply, in training and evaluation (training's default).
        sft: overrides of the warm start's ``wmrl train autoresearch-sft`` (beyond the device's).
        eval_in_samples / eval_out_samples / eval_seeds: trajectories per task and seed, in-sample
            (the training tasks) and held-out (the bundled ``eval`` split).
        held_out: also evaluate on the held-out tasks (in-sample alone answers "did it learn").
        threads_per_process: ``OMP_NUM_THREADS`` of every stage (the machine's cores are shared by
            all the stages running at once).
        warm_share: the budget's fraction by which the warm start must end.
        stop_grace_s: seconds a run may take to finish its step after the Ctrl-C at the deadline.
        eval_reserve_s: seconds kept at the end for the evaluations of the runs' last checkpoints
            (the warm start's run beside the GRPO phase); GRPO gets everything in between.
    """

    device: str = "cuda"
    dtype: str = "bfloat16"
    backend: str = "subprocess"
    sandbox_workers: int = 6
    tasks: tuple[str, ...] = QUICKSTART_TASKS
    modes: tuple[str, ...] = ("real", "world_model", "wmrl")
    seeds: tuple[int, ...] = (0,)
    variants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    steps: int = 60
    groups_per_step: int = 8
    group_size: int = 8
    prompts_per_task: int = 4
    learning_rate: float = 1e-3
    anchor_fraction: float = 0.25
    micro_batch_size: int = 16
    wm_batch_size: int = 16
    max_new_tokens: int = 352
    sft: tuple[str, ...] = ("micro_batch_size=4", "sandbox.workers=12")
    eval_in_samples: int = 8
    eval_out_samples: int = 2
    eval_seeds: tuple[int, ...] = (0, 1)
    eval_batch_size: int = 32
    held_out: bool = True
    warm_share: float = 0.45
    stop_grace_s: float = 45.0
    eval_reserve_s: float = 90.0
    extra_train: tuple[str, ...] = field(default_factory=tuple)
    threads_per_process: int = 4

    def changed(self, changes: dict[str, Any]) -> Plan:
        """This plan with the fields in ``changes`` replaced (lists become tuples)."""

        def frozen(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: frozen(v) for k, v in value.items()}
            return tuple(value) if isinstance(value, list) else value

        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown plan fields {sorted(unknown)}")
        return replace(self, **{k: frozen(v) for k, v in changes.items()})

    def runs(self) -> list[RunSpec]:
        """The GRPO runs of the training phase: every mode at every seed, then the variants."""
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        several = len(self.seeds) > 1
        out = [
            RunSpec(f"{mode}-s{seed}" if several else mode, mode, seed, (), self.held_out)
            for mode in self.modes
            for seed in self.seeds
        ]
        for name, settings in self.variants.items():

            def last(key: str, default: str, settings: tuple[str, ...] = settings) -> str:
                # the command line's last setting of a key is the one that runs
                values = [x.split("=", 1)[1] for x in settings if x.startswith(f"{key}=")]
                return values[-1] if values else default

            mode, seed = last("mode", "wmrl"), int(last("seed", str(self.seeds[0])))
            out.append(RunSpec(name, mode, seed, tuple(settings), False))
        names = [r.name for r in out]
        if len(set(names)) != len(names):
            raise ValueError(f"run names collide: {names}")
        reserved = {"warm", "eval", "logs", "start"} & set(names)
        if reserved:
            raise ValueError(f"run names {sorted(reserved)} are the warm start's or the check's own folders")
        return out

    @classmethod
    def rehearsal(cls) -> Plan:
        """The same stages sized for a 2-core CPU (minutes): a tiny corpus, 2 rollouts a group."""
        return cls(
            device="cpu",
            dtype="float32",
            sandbox_workers=2,
            modes=("real", "wmrl"),
            steps=3,
            groups_per_step=2,
            group_size=2,
            prompts_per_task=1,
            micro_batch_size=2,
            wm_batch_size=2,
            max_new_tokens=24,
            sft=(
                "epochs=1",
                "corpus.limit=1",
                "corpus.agent_per_task=1",
                "corpus.world_model_per_task=0",
                "sandbox.workers=2",
            ),
            eval_in_samples=1,
            eval_out_samples=1,
            eval_seeds=(0,),
            eval_batch_size=2,
            anchor_fraction=0.5,
            stop_grace_s=60.0,
            eval_reserve_s=300.0,
        )


@dataclass(frozen=True)
class RunSpec:
    """One GRPO run of the plan: its folder name, mode, seed, extra settings, held-out evaluation."""

    name: str
    mode: str
    seed: int
    settings: tuple[str, ...]
    held_out: bool


@dataclass
class _Stage:
    """One ``wmrl`` command of the check, running or done."""

    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    ended: float | None = None
    interrupted: bool = False

    def start(self, env: dict[str, str]) -> _Stage:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        handle = self.log.open("w")
        # Its own session: a signal sent to it reaches neither this script nor the other runs. Ctrl-C
        # restored to its default: a script started in the background (`nohup ... &`) ignores SIGINT
        # and its children inherit that, so the Ctrl-C at the deadline would never stop a run.
        self.process = subprocess.Popen(
            self.argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_default_ctrl_c,
        )
        handle.close()
        self.started = time.perf_counter()
        return self

    def poll(self) -> int | None:
        code = self.process.poll() if self.process is not None else None
        if code is not None and self.ended is None:
            self.ended = time.perf_counter()
        return code

    def report(self) -> dict[str, Any]:
        tail = self.log.read_text(errors="replace")[-2500:] if self.log.is_file() else ""
        return {
            "argv": self.argv,
            "exit_code": self.process.returncode if self.process is not None else None,
            "seconds": None if self.ended is None else round(self.ended - self.started, 1),
            "interrupted_at_deadline": self.interrupted,
            "log_tail": tail,
        }


def _cli() -> list[str]:
    return [sys.executable, "-m", "wmrl.core.cli"]


def _wait(stages: list[_Stage], deadline: float, poll_s: float = 2.0) -> None:
    """Until every stage has ended or ``deadline`` (``time.perf_counter`` seconds) passed."""
    while time.perf_counter() < deadline and any(s.poll() is None for s in stages):
        time.sleep(poll_s)


def _default_ctrl_c() -> None:
    """In a stage's process before it runs: SIGINT raises KeyboardInterrupt again (see _Stage.start)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(stages: list[_Stage], grace_deadline: float) -> None:
    """Ctrl-C each running stage (it finishes its step and checkpoints), then a second Ctrl-C and a
    kill for those still running at ``grace_deadline``."""
    for stage in stages:
        if stage.poll() is None:
            stage.interrupted = True
            stage.process.send_signal(signal.SIGINT)
    _wait(stages, grace_deadline)
    for stage in stages:
        if stage.poll() is None:
            stage.process.send_signal(signal.SIGINT)
    _wait(stages, grace_deadline + 20)
    for stage in stages:
        if stage.poll() is None:
            stage.process.kill()
            stage.process.wait()
            stage.poll()


def _steps_done(run: Path) -> int:
    """The last checkpoint's step (0: none)."""
    steps = [int(p.name.split("-")[-1]) for p in (run / "checkpoints").glob("checkpoint-*") if p.is_dir()]
    return max(steps, default=0)


def _metrics(run: Path) -> list[dict[str, Any]]:
    """The run's per-step rows (not the end-of-training summary rows a closing ``--resume`` adds)."""
    from wmrl.core.runlog import read_metrics

    return [r for r in read_metrics(run) if "reward" in r]


def _json(path: Path) -> Any:
    """A JSON file a stage may or may not have written (``None``: it did not)."""
    return json.loads(path.read_text()) if path.is_file() else None


def _curve(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = ("reward", "executed/valid_rate", "executed/position", "wmrl/anchor_fraction_realised")
    out: dict[str, list[Any]] = {"step": [r.get("step") for r in rows]}
    for key in keys:
        out[key] = [r.get(key) for r in rows]
    return out


def _eval_summary(path: Path) -> dict[str, Any] | None:
    data = _json(path)
    keep = ("valid_rate", "valid_rate_sem", "overall", "overall_sem", "medal_rate", "medal_rate_sem")
    return None if data is None else {k: data.get(k) for k in keep}


def warm_start_command(plan: Plan, out: Path) -> list[str]:
    """``wmrl train autoresearch-sft`` of the warm start, on the plan's device (after ``wmrl``)."""
    return [
        "train", "autoresearch-sft", "--out", str(out), "--no-progress", f"model.device={plan.device}",
        f"model.dtype={plan.dtype}", f"sandbox.backend={plan.backend}", "logging.report_to=[]", *plan.sft,
    ]  # fmt: skip


def train_command(
    plan: Plan, out: Path, mode: str, start_model: str, seed: int = 0, settings: tuple[str, ...] = ()
) -> list[str]:
    """``wmrl train autoresearch`` of one mode from ``start_model`` (after ``wmrl``); ``settings``
    come last, so they win over the plan's."""
    anchors = [f"corrector.scheduler.fraction={plan.anchor_fraction}"] if mode == "wmrl" else []
    return [
        "train", "autoresearch", "--out", str(out), "--no-progress", f"mode={mode}",
        f"model.path={start_model}", f"model.device={plan.device}", f"model.dtype={plan.dtype}",
        f"sandbox.backend={plan.backend}", f"steps={plan.steps}", f"groups_per_step={plan.groups_per_step}",
        f"group_size={plan.group_size}", f"tasks.ids=[{','.join(plan.tasks)}]",
        f"tasks.prompts_per_task={plan.prompts_per_task}", f"grpo.micro_batch_size={plan.micro_batch_size}",
        f"grpo.max_completion_tokens={plan.max_new_tokens}", f"sandbox.workers={plan.sandbox_workers}",
        f"world_model.backend.batch_size={plan.wm_batch_size}", f"learning_rate={plan.learning_rate}",
        f"seed={seed}", "logging.report_to=[]", "tasks.action=script", "lora.last_layers=0",
        # a checkpoint every step: a run stopped twice at the deadline loses at most the step in flight
        "checkpoint.every=1", "checkpoint.keep=1", *anchors, *plan.extra_train, *settings,
    ]  # fmt: skip


def close_command(out: Path, steps: int) -> list[str]:
    """Close a run stopped at the deadline at the step it reached (after ``wmrl``)."""
    return ["train", "autoresearch", "--out", str(out), "--resume", "--no-progress", f"steps={steps}",
            "logging.report_to=[]"]  # fmt: skip


def eval_commands(
    plan: Plan, work: Path, name: str, model: str, held_out: bool | None = None
) -> dict[str, list[str]]:
    """``wmrl eval autoresearch`` of ``model``, in-sample on the training tasks and held-out (unless
    ``held_out`` is false; ``None``: the plan's), by stage name (after ``wmrl``); each writes
    ``work/eval/<name>-<split>/``."""
    common = [
        "--device", plan.device, "--backend", plan.backend, "--temperature", "0.7",
        "--max-new-tokens", str(plan.max_new_tokens), "--time-limit", "60", "--no-progress", "--json",
        "--seeds", json.dumps(list(plan.eval_seeds)), f"batch_size={plan.eval_batch_size}",
        f"sandbox.workers={plan.sandbox_workers}",
    ]  # fmt: skip
    out = {}
    splits = [("in_sample", ",".join(plan.tasks), plan.eval_in_samples, ["--in-sample"])]
    if plan.held_out if held_out is None else held_out:
        splits.append(("held_out", "eval", plan.eval_out_samples, []))
    for split, tasks, samples, extra in splits:
        dest = work / "eval" / f"{name}-{split}"
        out[f"eval_{name}_{split}"] = [
            "eval", "autoresearch", "--model", model, "--tasks", tasks, "--samples", str(samples),
            "--out", str(dest), *common, *extra,
        ]  # fmt: skip
    return out


def _eval_stages(plan: Plan, work: Path, name: str, model: str, held_out: bool | None = None) -> list[_Stage]:
    return [
        _Stage(stage, [*_cli(), *argv], work / "logs" / f"{stage}.log")
        for stage, argv in eval_commands(plan, work, name, model, held_out).items()
    ]


def run_real_lm(work: Path, budget_s: float, plan: Plan | None = None, log=print) -> dict[str, Any]:  # noqa: C901 (the complexity ratchet: split it when it is next changed)
    """The check (see the module docstring); ``budget_s`` wall seconds from now for all of it."""
    plan = plan or Plan()
    t0 = time.perf_counter()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(plan.threads_per_process),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    out: dict[str, Any] = {"plan": asdict(plan), "budget_s": budget_s}

    # 1. The warm start.
    warm = work / "warm"
    sft = _Stage("warm_start", [*_cli(), *warm_start_command(plan, warm)], work / "logs" / "warm_start.log")
    sft.start(env)
    log(f"[real_lm] warm start on {plan.device} ...")
    warm_end = t0 + plan.warm_share * budget_s
    _wait([sft], warm_end)
    _stop([sft], warm_end + 5)
    out["warm_start"] = sft.report()
    if sft.process.returncode != 0 or not (warm / "final").is_dir():
        out["error"] = "the warm start did not finish; nothing else ran"
        return out
    out["warm_start"]["summary"] = _json(warm / "run_summary.json")
    out["warm_start"]["corpus_report"] = _json(warm / "corpus_report.json")
    start_model = str(warm / "final")

    # 2. The modes (at each seed) and the variants side by side.
    specs = {spec.name: spec for spec in plan.runs()}
    runs = {
        name: _Stage(
            name,
            [*_cli(), *train_command(plan, work / name, spec.mode, start_model, spec.seed, spec.settings)],
            work / "logs" / f"train_{name}.log",
        )
        for name, spec in specs.items()
    }
    for stage in runs.values():
        stage.start(env)
    start_evals = _eval_stages(plan, work, "start", start_model)
    for stage in start_evals:
        stage.start(env)
    log(f"[real_lm] training {list(runs)} side by side, the warm start's evaluations beside them ...")
    train_end = t0 + budget_s - plan.stop_grace_s - plan.eval_reserve_s
    # Each run's last checkpoint is evaluated as soon as the run ends (by itself, or stopped at the
    # deadline), so a run that ends early does not wait for the others; beside that, a run stopped
    # at the deadline is closed at the step it reached (final policy, plots, summary), as a user would.
    evals: list[_Stage] = []
    closing: list[_Stage] = []
    ended: set[str] = set()

    def after(name: str, stage: _Stage) -> None:
        ended.add(name)
        done = _steps_done(work / name)
        if done == 0:
            return
        checkpoint = str(work / name / "checkpoints" / f"checkpoint-{done}")
        started = _eval_stages(plan, work, name, checkpoint, specs[name].held_out)
        if stage.process.returncode != 0:  # stopped at the deadline (or crashed): close it at its last step
            started.append(
                _Stage(
                    f"close_{name}",
                    [*_cli(), *close_command(work / name, done)],
                    work / "logs" / f"close_{name}.log",
                )
            )
        for new in started:
            new.start(env)
            (closing if new.name.startswith("close_") else evals).append(new)
        log(f"[real_lm] {name} ended at step {done}: {len(started)} stages started")

    while len(ended) < len(runs):
        for name, stage in runs.items():
            if name not in ended and stage.poll() is not None:
                after(name, stage)
        left = train_end - time.perf_counter()
        if left <= 0 or len(ended) == len(runs):
            break
        time.sleep(min(2.0, left))
    running = [stage for name, stage in runs.items() if name not in ended]
    _stop(running, train_end + plan.stop_grace_s - 20)  # (_stop adds 20 s for a hard stop)
    for name, stage in runs.items():
        if name not in ended:
            after(name, stage)
    _wait([*start_evals, *evals, *closing], t0 + budget_s)
    _stop([*start_evals, *evals, *closing], t0 + budget_s + 5)
    out["runs"] = {}
    for name, stage in runs.items():
        run = work / name
        rows = _metrics(run)
        out["runs"][name] = {
            "mode": specs[name].mode,
            "seed": specs[name].seed,
            "settings": list(specs[name].settings),
            **stage.report(),
            "steps_done": _steps_done(run),
            "curve": _curve(rows),
            "step_seconds": [r.get("step_time") for r in rows],
            "summary": _json(run / "run_summary.json"),
            "cost_report": _json(run / "cost_report.json"),
        }
    out["closing"] = {s.name: s.report() for s in closing}
    out["evaluations"] = {}
    for stage in [*start_evals, *evals]:
        dest = Path(stage.argv[stage.argv.index("--out") + 1])
        report = stage.report()
        report["summary"] = _eval_summary(dest / "eval_report.json")
        out["evaluations"][stage.name] = report
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--rehearsal", action="store_true", help="the CPU-sized plan")
    parser.add_argument("--plan", default="{}", help="JSON of Plan fields to change")
    args = parser.parse_args()
    plan = (Plan.rehearsal() if args.rehearsal else Plan()).changed(json.loads(args.plan))
    result = run_real_lm(args.work, args.budget_s, plan)
    (args.work / "real_lm.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "plan"}, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
