"""A simulated GRPO problem where the true reward is known and real execution is costly.

The problem (documented for readers in ``docs/benchmarks/method.md``):

* **Tasks and solutions.** ``n_tasks`` tasks, each with a discrete space of ``n_solutions``
  candidate solutions. The policy is a softmax over solutions per task (logits start at 0).
* **Reward landscape (sparse).** Each solution has a fixed outcome on the grading ladder, as an
  ML script would: syntax error 0.0, runtime error 0.1, ran without a submission 0.2, or valid
  with quality ``q ~ Beta(2, 5)`` scoring ``0.5 + 0.5 q``. Most solutions fail; excellent ones are
  rare. Real execution returns the true reward (and is unknown, ``None``, with a small harness
  failure rate), or a noisy draw around it (``exec_noise``):
  - ``none``: exact;
  - ``gaussian``: ``r + N(0, exec_sd²)`` (an ML script's score varies with its seed);
  - ``flaky``: with probability ``flaky_rate`` the run fails (timeout, score 0);
  - ``bernoulli``: a 0/1 outcome with success probability ``r`` (an episode in a stochastic environment).
  The anchor declares its noise model when ``declare_noise`` (``flaky`` is never declared: a user
  rarely knows their flakiness rate) and each rollout's solution (task, index) is passed as its
  solution key when ``solution_keys``.
* **World model (what the paper describes).**
  ``s = clip(h_t(r + b + ξ), 0, 1)`` where
  - ``b`` is a *persistent per-solution error* (the same every time that solution is graded):
    small Gaussian misjudgement plus *status confusions* — some crashing solutions look valid to
    the world model, some valid ones look broken. Calibration cannot remove it (it is not a
    function of the score); only real execution of that solution reveals it.
  - ``ξ`` is fresh per-call noise.
  - ``h_t`` is a *monotone but non-affine* distortion, different per task, which *drifts as the
    policy moves*: its curvature goes from convex to concave as the policy's true reward rises
    (the world model grows optimistic about the code a better policy writes). An affine map would
    be invisible to GRPO; this one changes within-group spacing, which calibration can undo.
  - a small share of calls is unknown (``None``).
* **GRPO.** Each step samples ``groups_per_step`` tasks and ``group_size`` solutions per task,
  forms group advantages with the corrector and takes an SGD step on the logits:
  ``θ_t += lr · mean_i(A_i (e_{k_i} − π_t))``.
* **Cost.** Counted per rollout: generation + update ``base_cost`` (every arm), world-model
  prediction ``wm_cost`` per prediction made, real execution ``exec_cost`` per rollout executed.

Everything is seeded: the same seed gives the same landscape, world model and initial policy in
every arm, so arms differ only in how they grade.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from wmrl.core.config import require
from wmrl.core.corrector import Corrector, CorrectorConfig
from wmrl.core.late import modelled_step_times
from wmrl.core.modes import apply_changes
from wmrl.core.sources import NoiseModel, as_source
from wmrl.core.surrogate import Floats, FusedWorldModel, NearestNeighbours, SurrogateSource

__all__ = ["ARMS", "EXEC_NOISE", "ArmResult", "Landscape", "SimConfig", "run_arm"]

# arm name -> corrector preset, or (preset, dotted settings on top). ``wmrl`` is the default configuration.
ARMS: dict[str, str | tuple[str, dict[str, Any]]] = {
    "real": "real",
    "world_model": "world_model",
    "wmrl": "wmrl",
    "debias_only": "debias_only",
    "fusion_only": "fusion_only",
    "uncorrected_mix": "uncorrected_mix",
    "wmrl_previous": "wmrl_previous",
    "wmrl_paper_weight": "wmrl_paper_weight",
    "wmrl_inverse_variance": "wmrl_inverse_variance",
    "wmrl_measured": "wmrl_measured",
    "wmrl_undeclared": "wmrl",
    "wmrl_repeats": "wmrl_repeats",
    "wmrl_rollout": "wmrl_rollout",
    "wmrl_adaptive_budget": "wmrl_adaptive_budget",
    "wmrl_active": "wmrl_active",
    # the strongest baselines: real execution with a result cache, and the paper's configuration
    "real_cache": "real_cache",
    "paper": "paper",
    # the default before issue 32, and the default with each of its parts taken away
    "wmrl_groups": "wmrl_groups",
    "wmrl_no_memory": "wmrl_no_memory",
    "wmrl_flat": "wmrl_flat",
    "wmrl_gain": "wmrl_gain",
    # the design of issue 32: each group's top-ranked solution not yet known is executed, every
    # outcome is remembered; fusions compared
    "mem_top": (
        "wmrl",
        {
            "scheduler.rollout_share": 1.0,
            "scheduler.floor": 0,
            "scheduler.rollout_depth": 1,
            "memory.enabled": True,
        },
    ),
    "mem_top_gain": (
        "wmrl",
        {
            "scheduler.rollout_share": 1.0,
            "scheduler.floor": 0,
            "scheduler.rollout_depth": 1,
            "memory.enabled": True,
            "fusion.mode": "gain",
        },
    ),
    # beyond the paper (issue 32, part 6): a surrogate world model learned from the run's outcomes over
    # features that put a solution's variants close together, fused with the world model by measured error
    "wmrl_surrogate": "wmrl",
    "wmrl_surrogate_reject": ("wmrl", {"scheduler.reject_share": 0.25}),
    "mem_top_flat": (
        "wmrl",
        {
            "scheduler.rollout_share": 1.0,
            "scheduler.floor": 0,
            "scheduler.rollout_depth": 1,
            "memory.enabled": True,
            "fusion.mode": "none",
        },
    ),
}


def arm_config(arm: str, base: CorrectorConfig, seed: int) -> CorrectorConfig:
    """The corrector configuration of ``arm`` on top of ``base``, seeded."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {sorted(ARMS)}")
    spec = ARMS[arm]
    preset, changes = (spec, {}) if isinstance(spec, str) else spec
    config = CorrectorConfig.preset(preset, base, seed=seed)
    return apply_changes(config, changes) if changes else config


#: Arms whose world model is the surrogate fused with the simulated one (``SimConfig.feature_dim``).
SURROGATE_ARMS = {"wmrl_surrogate", "wmrl_surrogate_reject"}
# Arms that run their preset without the noise declaration the simulated anchor could give.
_UNDECLARED = {"wmrl_undeclared", "wmrl_repeats"}

ExecNoise = Literal["none", "gaussian", "flaky", "bernoulli"]
EXEC_NOISE: tuple[ExecNoise, ...] = ("none", "gaussian", "flaky", "bernoulli")


@dataclass(frozen=True)
class SimConfig:
    """The simulated problem. Units: rewards in [0, 1]; costs in abstract units per rollout."""

    n_tasks: int = 24
    n_solutions: int = 48
    groups_per_step: int = 16
    group_size: int = 8
    steps: int = 300
    lr: float = 2.0
    # reward landscape: probabilities of syntax error, runtime error, ran without submission (rest valid)
    p_syntax: float = 0.05
    p_runtime: float = 0.45
    p_no_submission: float = 0.2
    # world model
    bias_strength: float = 1.0
    noise: float = 0.12
    confusion_rate: float = 0.15
    drift: float = 1.0
    wm_unknown: float = 0.03
    real_unknown: float = 0.01
    # real execution's noise (see the module docstring)
    exec_noise: ExecNoise = "none"
    exec_sd: float = 0.1
    flaky_rate: float = 0.1
    declare_noise: bool = True
    solution_keys: bool = True
    # recurrence: each solution comes in ``variants`` textual variants that share its outcome (and
    # the world model's persistent error) but not its key; 0: every sampled solution is new
    variants: int = 1
    # the features a surrogate world model reads: each solution's embedding in feature_dim dimensions,
    # its variants scattered around it with sd variant_spread (surrogate arms only)
    feature_dim: int = 8
    variant_spread: float = 0.1
    # costs
    base_cost: float = 1.0
    wm_cost: float = 0.1
    exec_cost: float = 5.0
    # asynchronous anchors (corrector.asynchrony.max_anchor_lag > 0): the duration of one execution batch
    # in step-times (a step's generation and world-model scoring take 1), for the modelled wall time
    # (ArmResult.wall); and the late gradient's importance weight min(pi_now / pi_behaviour, clip) (None:
    # a plain stale gradient at the current policy)
    exec_latency: float = 0.0
    late_importance_clip: float | None = None
    corrector: CorrectorConfig = field(default_factory=CorrectorConfig)

    def __post_init__(self) -> None:
        require(self.n_tasks >= self.groups_per_step >= 1, "need n_tasks >= groups_per_step >= 1")
        require(self.n_solutions >= 2 and self.group_size >= 2, "need n_solutions >= 2 and group_size >= 2")
        require(self.steps >= 1 and self.lr > 0, "need steps >= 1 and lr > 0")
        require(
            self.p_syntax + self.p_runtime + self.p_no_submission < 1,
            "failure probabilities must leave room for valid solutions",
        )
        for name in (
            "bias_strength",
            "noise",
            "confusion_rate",
            "drift",
            "wm_unknown",
            "real_unknown",
            "base_cost",
            "wm_cost",
            "exec_cost",
            "exec_latency",
        ):
            require(getattr(self, name) >= 0, f"{name} must be >= 0")
        require(
            self.late_importance_clip is None or self.late_importance_clip >= 1,
            f"late_importance_clip must be None or >= 1; got {self.late_importance_clip!r}",
        )
        require(self.confusion_rate * self.bias_strength <= 1, "confusion_rate * bias_strength must be <= 1")
        require(
            self.exec_noise in EXEC_NOISE, f"exec_noise must be one of {EXEC_NOISE}; got {self.exec_noise!r}"
        )
        require(self.exec_sd >= 0 and 0 <= self.flaky_rate < 1, "need exec_sd >= 0 and 0 <= flaky_rate < 1")
        require(
            isinstance(self.variants, int) and self.variants >= 0,
            f"variants must be an integer >= 0 (0: nothing recurs); got {self.variants!r}",
        )

    def declared_noise(self) -> NoiseModel | None:
        """What the simulated anchor declares about its noise (``None``: nothing)."""
        if not self.declare_noise or self.exec_noise == "flaky":
            return None
        if self.exec_noise == "gaussian":
            return NoiseModel.gaussian(self.exec_sd**2)
        if self.exec_noise == "bernoulli":
            return NoiseModel.bernoulli()
        return NoiseModel.deterministic()

    def execute(self, rng: np.random.Generator, true: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """One real execution of every rollout: a draw of the observed score around ``true``."""
        if self.exec_noise == "gaussian":
            return cast("npt.NDArray[Any]", true + rng.normal(0.0, self.exec_sd, true.shape))
        if self.exec_noise == "flaky":
            return np.where(rng.random(true.shape) < self.flaky_rate, 0.0, true)
        if self.exec_noise == "bernoulli":
            return (rng.random(true.shape) < true).astype(float)
        return true.copy()


class Landscape:
    """The true rewards and the world model's error structure for one seed."""

    def __init__(self, cfg: SimConfig, seed: int) -> None:
        rng = np.random.default_rng([seed, 0x5EED])
        shape = (cfg.n_tasks, cfg.n_solutions)
        u = rng.random(shape)
        p1 = cfg.p_syntax
        p2 = p1 + cfg.p_runtime
        p3 = p2 + cfg.p_no_submission
        quality = rng.beta(2.0, 5.0, shape)
        self.reward = np.where(u < p1, 0.0, np.where(u < p2, 0.1, np.where(u < p3, 0.2, 0.5 + 0.5 * quality)))
        self.valid = u >= p3
        # Persistent per-solution error: Gaussian misjudgement + status confusions.
        misjudge = rng.normal(0.0, 0.08 * cfg.bias_strength, shape)
        confuse = rng.random(shape) < cfg.confusion_rate * cfg.bias_strength
        looks_valid = 0.5 + 0.5 * rng.beta(2.0, 3.0, shape)  # what a confused world model believes
        looks_broken = 0.1
        confusion = np.where(self.valid, looks_broken - self.reward, looks_valid - self.reward)
        self.bias = misjudge + np.where(confuse, confusion, 0.0)
        # Per-task distortion offsets (the per-task calibration has something to find).
        self.task_offset = rng.uniform(-0.08, 0.08, cfg.n_tasks)
        self.best = self.reward.max(axis=1)
        # Each solution's embedding (what a text embedding of the code would be): drawn from a
        # generator of its own so that the problem above is the same with or without it.
        emb_rng = np.random.default_rng([seed, 0xE3B])
        self.embedding = emb_rng.normal(0.0, 1.0, (cfg.n_tasks, cfg.n_solutions, cfg.feature_dim))
        self.cfg = cfg

    def distort(self, x: npt.NDArray[Any], tasks: npt.NDArray[Any], progress: float) -> npt.NDArray[Any]:
        """``h_t``: monotone, non-affine, drifting with the policy's progress in [0, 1]."""
        power = np.exp(np.log(2.0) * (1.0 - 2.0 * min(max(progress, 0.0), 1.0) * self.cfg.drift))
        base = np.clip(x, 0.0, 1.0) ** power
        return cast("npt.NDArray[Any]", 0.15 + self.task_offset[tasks][:, None] + 0.75 * base)

    def true_value(self, logits: npt.NDArray[Any]) -> float:
        """Mean over tasks of the policy's expected true reward."""
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return float(np.mean(np.sum(p * self.reward, axis=1)))


@dataclass
class ArmResult:
    """Per-step curves of one arm on one seed: true reward, and the counts that make up cost."""

    true_reward: npt.NDArray[Any]  # (steps + 1,) including the initial policy
    rollouts: npt.NDArray[Any]  # (steps,) rollouts generated per step
    wm_calls: npt.NDArray[Any]  # (steps,) world-model predictions per step
    executions: npt.NDArray[Any]  # (steps,) real executions per step
    metrics: list[dict[str, Any]] = field(default_factory=list)
    # (steps + 1,) modelled wall time at the start of each step and at the end, in step-times (a model,
    # wmrl.core.late.modelled_step_times, not a measurement); None for results saved before it existed
    wall: npt.NDArray[Any] | None = None

    def cost(self, cfg: SimConfig, exec_cost: float | None = None) -> npt.NDArray[Any]:
        """Cumulative cost after each step, shape ``(steps + 1,)`` (0 before training)."""
        c = cfg.exec_cost if exec_cost is None else exec_cost
        per_step = self.rollouts * cfg.base_cost + self.wm_calls * cfg.wm_cost + self.executions * c
        return np.concatenate([[0.0], np.cumsum(per_step)])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (lists keep ints as ints and floats as floats, so :meth:`from_dict` is exact)."""
        return {
            "true_reward": self.true_reward.tolist(),
            "rollouts": self.rollouts.tolist(),
            "wm_calls": self.wm_calls.tolist(),
            "executions": self.executions.tolist(),
            "metrics": self.metrics,
            "wall": None if self.wall is None else self.wall.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArmResult:
        return cls(
            true_reward=np.asarray(data["true_reward"]),
            rollouts=np.asarray(data["rollouts"]),
            wm_calls=np.asarray(data["wm_calls"]),
            executions=np.asarray(data["executions"]),
            metrics=list(data["metrics"]),
            wall=None if data.get("wall") is None else np.asarray(data["wall"]),
        )


class _Item:
    """A simulated rollout as the surrogate sees it: the world model's score and the solution's features."""

    __slots__ = ("features", "wm")

    def __init__(self, wm: float, features: Floats) -> None:
        self.wm, self.features = float(wm), features


def _solution_keys(
    cfg: SimConfig, rng: np.random.Generator, step: int, tasks: npt.NDArray[Any], picks: npt.NDArray[Any]
) -> list[list[str]]:
    """The key of each sampled solution: ``task:solution`` (``:variant`` when solutions have several)."""
    rows = []
    for i, (t, row) in enumerate(zip(tasks.tolist(), picks.tolist(), strict=True)):
        if cfg.variants == 1:
            rows.append([f"{t}:{k}" for k in row])
        elif cfg.variants == 0:
            rows.append([f"{t}:{k}:{step}.{i}.{j}" for j, k in enumerate(row)])
        else:
            v = rng.integers(cfg.variants, size=len(row)).tolist()
            rows.append([f"{t}:{k}:{x}" for k, x in zip(row, v, strict=True)])
    return rows


def run_arm(
    cfg: SimConfig,
    arm: str,
    seed: int,
    keep_metrics: bool = False,
    until_cost: float | None = None,
    max_steps: int | None = None,
) -> ArmResult:
    """Train one arm on one seed; return its curves.

    ``cfg.steps`` steps, or more with ``until_cost``: steps continue until the cumulative cost
    reaches ``until_cost`` (so cheaper arms can be compared at equal cost), at most ``max_steps``
    (default ``20 · cfg.steps``).
    """
    land = Landscape(cfg, seed)
    rng = np.random.default_rng([seed, 0xA11, 7])
    variant_rng = np.random.default_rng([seed, 0x7A2])  # apart, so variants=1 draws as before
    corrector = Corrector(arm_config(arm, cfg.corrector, seed))
    fused = None
    feature_rng = np.random.default_rng([seed, 0xFEA7])
    if arm in SURROGATE_ARMS:
        fused = FusedWorldModel(
            [
                as_source(lambda items: [None if np.isnan(it.wm) else it.wm for it in items], "world_model"),
                SurrogateSource(
                    lambda it: it.features,
                    NearestNeighbours(k=3, radius=4 * cfg.variant_spread * np.sqrt(cfg.feature_dim)),
                ),
            ]
        )
    uses_wm = not arm.startswith("real")
    declared = None if arm in _UNDECLARED else cfg.declared_noise()
    with_keys = cfg.solution_keys
    logits = np.zeros((cfg.n_tasks, cfg.n_solutions))
    start = land.true_value(logits)
    top = float(land.best.mean())
    curve = [start]
    rollouts, wm_calls, executions, metrics = [], [], [], []
    G = cfg.group_size
    limit = max_steps if max_steps is not None else 20 * cfg.steps
    spent = 0.0
    lag = corrector.config.asynchrony.max_anchor_lag
    in_flight: list[_Pending] = []  # executions submitted and not landed (lag > 0)
    step = -1
    while True:
        step += 1
        if step >= cfg.steps and (until_cost is None or spent >= until_cost or step >= limit):
            break
        tasks = rng.choice(cfg.n_tasks, cfg.groups_per_step, replace=False)
        probs = np.exp(logits[tasks] - logits[tasks].max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        # Inverse-CDF sampling of G solutions per group, vectorised over groups.
        cdf = np.cumsum(probs, axis=1)
        picks = (rng.random((len(tasks), G))[:, :, None] > cdf[:, None, :]).sum(axis=2)
        picks = np.minimum(picks, cfg.n_solutions - 1)
        true = land.reward[tasks[:, None], picks]
        progress = (curve[-1] - start) / max(top - start, 1e-9)
        noisy = true + land.bias[tasks[:, None], picks] + rng.normal(0.0, cfg.noise, true.shape)
        wm = np.clip(land.distort(noisy, tasks, progress), 0.0, 1.0)
        wm[rng.random(wm.shape) < cfg.wm_unknown] = np.nan
        observed = cfg.execute(rng, true)
        real_all = np.where(rng.random(true.shape) < cfg.real_unknown, np.nan, observed)
        keys = [f"{step}:{i}" for i in range(len(tasks))]
        task_keys = [f"t{t}" for t in tasks]
        solutions = None
        if with_keys:
            solutions = _solution_keys(cfg, variant_rng, step, tasks, picks)
        # What the execution memory knows is graded from it: the world model is not asked.
        known = corrector.known(solutions, cast(tuple[int, int], wm.shape)).known  # (len(tasks), G)
        wm = np.where(known, np.nan, wm)
        items = None
        if fused is not None:  # the surrogate and the world model, fused by their measured errors
            features = land.embedding[tasks[:, None], picks] + feature_rng.normal(
                0.0, cfg.variant_spread, (*picks.shape, cfg.feature_dim)
            )
            items = [[_Item(wm[g, i], features[g, i]) for i in range(G)] for g in range(len(tasks))]
            cells = [(g, i) for g in range(len(tasks)) for i in range(G) if not np.isnan(wm[g, i])]
            scored = fused.score([items[g][i] for g, i in cells])
            for (g, i), value in zip(cells, scored, strict=True):
                wm[g, i] = np.nan if value is None else value
        late_grads: list[tuple[_Pending, npt.NDArray[Any]]] = []
        if lag > 0:  # the executions due now land first: calibration, memory, and their groups' gradient
            in_flight, late_grads = _land_due(corrector, in_flight, step, declared, fused)
            running = frozenset(k for p in in_flight for k in p.keys)
            plan = corrector.plan(keys, task_keys, wm, solution_keys=solutions, in_flight_keys=running)
        else:
            plan = corrector.plan(keys, task_keys, wm, solution_keys=solutions)
        # a plan made from world-model scores carries both masks
        assert plan.execute is not None and plan.repeat is not None
        real = np.where(plan.execute, real_all, np.nan)
        again = None
        if plan.repeat.any():
            again = np.where(plan.repeat, cfg.execute(rng, true), np.nan)
        submitted = None
        if lag > 0 and (plan.execute.any() or plan.repeat.any()):
            submitted = (real, again)  # in flight: this step trains on what is known without them
            real = np.full_like(real, np.nan)
            again = None
        out = corrector.correct(
            plan, wm, real, anchor_repeats=again, anchor_noise=declared, solution_keys=solutions
        )
        if submitted is not None:
            in_flight.append(
                _Pending(step + lag, plan, wm, *submitted, out, solutions, tasks, picks, probs, items)
            )
        if fused is not None and items is not None:
            _learn(fused, items, real)
        adv = np.nan_to_num(out.advantages, nan=0.0)
        # ∇ log π(k) = e_k − π ; mean over all rollouts of the batch (as a token-mean loss would).
        onehot = np.zeros((len(tasks), G, cfg.n_solutions))
        np.put_along_axis(onehot, picks[:, :, None], 1.0, axis=2)
        grad = np.einsum("gi,gik->gk", adv, onehot - probs[:, None, :]) / (len(tasks) * G)
        _apply_late(cfg, logits, late_grads, len(tasks))
        np.add.at(logits, tasks, cfg.lr * grad * len(tasks))
        curve.append(land.true_value(logits))
        n_roll = len(tasks) * G
        spent += n_roll * cfg.base_cost
        spent += (int(n_roll - known.sum()) if uses_wm else 0) * cfg.wm_cost
        spent += int(plan.execute.sum() + plan.repeat.sum()) * cfg.exec_cost
        rollouts.append(n_roll)
        wm_calls.append(int(n_roll - known.sum()) if uses_wm else 0)
        executions.append(int(plan.execute.sum() + plan.repeat.sum()))
        if keep_metrics:
            metrics.append(out.metrics)
    return ArmResult(
        true_reward=np.array(curve),
        rollouts=np.array(rollouts, dtype=float),
        wm_calls=np.array(wm_calls, dtype=float),
        executions=np.array(executions, dtype=float),
        metrics=metrics,
        wall=modelled_step_times([e > 0 for e in executions], cfg.exec_latency, lag),
    )


@dataclass
class _Pending:
    """One simulated step's executions in flight (asynchronous anchors), and what that step trained on."""

    due: int
    plan: Any
    wm: npt.NDArray[Any]
    real: npt.NDArray[Any]
    again: npt.NDArray[Any] | None
    correction: Any
    solutions: list[list[str]] | None
    tasks: npt.NDArray[Any]
    picks: npt.NDArray[Any]
    probs: npt.NDArray[Any]
    items: list[list[_Item]] | None

    @property
    def rewards(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.rewards)

    @property
    def advantages(self) -> npt.NDArray[Any]:
        return cast("npt.NDArray[Any]", self.correction.advantages)

    @property
    def keys(self) -> frozenset[str]:
        if self.solutions is None:
            return frozenset()
        rows, cols = np.nonzero(self.plan.execute)
        return frozenset(self.solutions[r][c] for r, c in zip(rows.tolist(), cols.tolist(), strict=True))


def _land_due(
    corrector: Corrector,
    in_flight: list[_Pending],
    step: int,
    declared: NoiseModel | None,
    fused: FusedWorldModel | None,
) -> tuple[list[_Pending], list[tuple[_Pending, npt.NDArray[Any]]]]:
    """Land the executions due at ``step``: returns what stays in flight and each landed step's late advantages."""
    landed = []
    for p in [p for p in in_flight if p.due <= step]:
        _, late_adv, _ = corrector.land(
            p.plan,
            p.wm,
            p.real,
            p.rewards,
            p.advantages,
            anchor_repeats=p.again,
            anchor_noise=declared,
            solution_keys=p.solutions,
        )
        if fused is not None and p.items is not None:
            _learn(fused, p.items, p.real)
        landed.append((p, late_adv))
    return [p for p in in_flight if p.due > step], landed


def _apply_late(
    cfg: SimConfig, logits: npt.NDArray[Any], late: list[tuple[_Pending, npt.NDArray[Any]]], n_groups: int
) -> None:
    """The landed groups' gradient: stale, at the current policy, over this step's batch size (with
    ``cfg.late_importance_clip``: weighted by min(pi_now / pi_behaviour, clip))."""
    G = cfg.group_size
    for p, late_adv in late:
        now = np.exp(logits[p.tasks] - logits[p.tasks].max(axis=1, keepdims=True))
        now /= now.sum(axis=1, keepdims=True)
        weight = np.nan_to_num(late_adv, nan=0.0)
        if cfg.late_importance_clip is not None:
            behaviour = np.take_along_axis(p.probs, p.picks, axis=1)
            current = np.take_along_axis(now, p.picks, axis=1)
            weight = weight * np.minimum(current / behaviour, cfg.late_importance_clip)
        onehot = np.zeros((len(p.tasks), G, cfg.n_solutions))
        np.put_along_axis(onehot, p.picks[:, :, None], 1.0, axis=2)
        grad = np.einsum("gi,gik->gk", weight, onehot - now[:, None, :]) / (n_groups * G)
        np.add.at(logits, p.tasks, cfg.lr * grad * n_groups)


def _learn(fused: FusedWorldModel, items: list[list[_Item]], real: npt.NDArray[Any]) -> None:
    """Teach the surrogate the executed rollouts' outcomes (NaN: not executed or unknown)."""
    done = [(g, i) for g in range(real.shape[0]) for i in range(real.shape[1]) if not np.isnan(real[g, i])]
    fused.learn([items[g][i] for g, i in done], [float(real[g, i]) for g, i in done])
