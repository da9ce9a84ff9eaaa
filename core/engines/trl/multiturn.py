"""K-turn episodes on TRL (``rollout_func``): K attempts per rollout, each graded, each outcome the next observation.

The anchor / world-model decision is made before the first turn is graded: for whole anchor groups
from keys alone, before generation; for per-rollout anchors (the default) from the world model's
scores of the first turn, which choose the trajectories to execute. A chosen trajectory is executed
for real at every turn and every other one is graded by the world model at every turn (the world
model also grades the executed rows: the other half of their calibration pairs). Per turn:

* the policy generates a reply for every row from ``prompt + everything so far`` (one batched,
  left-padded ``generate``); the domain's item function turns it into what the sources grade;
* :meth:`~wmrl.core.pipeline.RewardPipeline.score` grades the turn (both streams concurrently);
* the domain's *episode* (:class:`TurnEpisode`) turns the outcome of the row's stream (its reward and
  ``Grade.feedback``) into the next user message, which is rendered with the chat template
  (:func:`feedback_suffix`) and appended to the completion with ``env_mask = 0``, so observation
  tokens never enter the loss.

The completion TRL trains on is ``reply_1 + observation_1 + ... + reply_K`` as token ids (the reply
tokens are exactly those sampled; nothing is re-tokenised). A row's reward is the episode's
trajectory reward; anchor rows also get the episode's aggregate of their world-model turn scores,
which pairs with the real reward for calibration.

The domain supplies only :data:`EpisodeFactory`: what a reply and an outcome mean for its agent.
Everything the rollout needs from the trainer comes in one :class:`TurnContext`.

**Asynchronous anchors** (``corrector.asynchrony.max_anchor_lag > 0``, :mod:`wmrl.core.late`): a
trajectory executed turn by turn would make the step wait for every turn's execution, so the rollout
runs *in the world model's shadow* (``TurnContext.shadow``): every row's observations are the world
model's, nothing is executed during it, and the rollout keeps each turn's items and the episodes.
The trainer then plans (per-rollout anchors read the whole trajectories' world-model scores) and
submits the chosen trajectories' turns for real execution off the critical path
(:func:`execute_trajectories`); their real trajectory reward is the episode's aggregate of the real
turn rewards (``TurnEpisode.aggregate``), the rule the world model's trajectory score follows. So an
executed trajectory saw exactly the observations every other trajectory of the step saw, and its
(world model, real) pair grades one and the same trajectory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wmrl.core.config import require_int
from wmrl.core.engines.trl.rank_failures import fail_together
from wmrl.core.pipeline import RewardPipeline

__all__ = [
    "EpisodeFactory",
    "TrajectoryScores",
    "TurnContext",
    "TurnEpisode",
    "execute_trajectories",
    "feedback_suffix",
    "multi_turn_rollout",
]

_SENTINEL = "\u2063WMRL-REPLY\u2063"


class TurnEpisode(Protocol):
    """One K-turn episode of a domain's agent.

    ``add_reply(text)`` records the policy's reply; ``add_outcome(reward, feedback, status)`` records
    how the turn was graded (``feedback`` is ``Grade.feedback`` of the stream that graded it, ``None``
    when unknown) and returns the next user message (``None`` after the last turn); ``reward()`` is
    the trajectory's reward; ``aggregate(rewards)`` applies the same rule to another list of turn
    rewards (the world model's, for an anchor row's calibration pair).
    """

    def add_reply(self, text: str) -> Any: ...

    def add_outcome(self, reward: float | None, feedback: Any, status: str | None) -> str | None: ...

    def reward(self) -> float | None: ...

    def aggregate(self, rewards: Sequence[float | None]) -> float | None: ...


#: ``(prompt, dataset row) -> TurnEpisode``.
EpisodeFactory = Callable[[Any, Mapping[str, Any]], TurnEpisode]


@dataclass
class TurnContext:
    """What the K-turn rollout of one rank's rows needs (built by ``WMRLGRPOTrainer.turn_context``).

    Attributes:
        rows: this rank's dataset rows, one per rollout.
        anchor: ``(n,)`` bool, the rows executed for real at every turn (whole anchor groups, or the
            trajectories per-rollout anchors chose); ``None`` until ``choose`` makes it.
        pipeline: the reward side (grades each turn, books the ledger).
        item_fn: ``(reply text, row) -> item``.
        episodes: the domain's episode factory.
        turns: K.
        tokenizer: the policy's tokenizer (chat template, decoding).
        template_kwargs: extra arguments of the chat template.
        generate: ``(contexts, max_new_tokens) -> replies`` as token ids (through the first stop token);
            with ``sampling_logprobs``, ``(replies, logprobs)``: the sampler's log-probability of each
            reply token (vLLM's, for TRL's importance-sampling correction).
        max_new_tokens: cap on each reply.
        stop_token_ids: tokens that end a reply.
        seconds / statuses / real_grades: where the step's seconds per stream and real-execution
            outcomes (labels, and the grades themselves) go.
    """

    rows: Sequence[Mapping[str, Any]]
    anchor: npt.NDArray[Any] | None
    pipeline: RewardPipeline
    item_fn: Callable[[str, Mapping[str, Any]], Any]
    episodes: EpisodeFactory
    turns: int
    tokenizer: Any
    template_kwargs: dict[str, Any]
    #: replies, or ``(replies, logprobs)`` with ``sampling_logprobs`` (see above)
    generate: Callable[[list[list[int]], int], Any]
    max_new_tokens: int
    stop_token_ids: set[int]
    seconds: Callable[[Mapping[str, float]], None]
    statuses: list[str] = field(default_factory=list)
    sampling_logprobs: bool = False
    #: the grades of this rank's real executions (every turn), for the domain's ``real_metrics``
    real_grades: list[Any] = field(default_factory=list)
    #: ``anchor`` unset: ``(first-turn world-model scores, (n,)) -> anchor rows``, the trajectories to
    #: execute (per-rollout anchors read the world model's scores before choosing)
    choose: Callable[[npt.NDArray[Any]], npt.NDArray[Any]] | None = None
    #: asynchronous anchors: every row is graded by the world model alone and nothing is executed during
    #: the rollout (``anchor`` and ``choose`` are ignored); the rollout fills ``turn_items`` and ``kept``
    shadow: bool = False
    #: per turn, the ``(n,)`` items the rows' replies became (filled by the rollout in ``shadow`` mode)
    turn_items: list[list[Any]] = field(default_factory=list)
    #: TRL processes: each turn's grading on one rank is agreed with every rank (``fail_together``), so a
    #: failed execution stops them all instead of leaving the others in the next turn's collective
    processes: int = 1
    #: the rows' episodes after the rollout (``shadow`` mode), for the real trajectory rewards
    kept: list[TurnEpisode] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a rollout with no turn would leave every row ungraded (and ``anchor`` unset)
        require_int(self.turns, "turns")


def feedback_suffix(
    tokenizer: Any, message: str, reply_ended: bool, template_kwargs: dict[str, Any] | None = None
) -> str:
    """The chat-template text between the end of an assistant reply and the next assistant turn.

    Rendered by the tokenizer's own template around a sentinel reply, so it is exact for any
    template: it closes the assistant turn (unless the reply already ended with the end-of-turn
    token, ``reply_ended``), adds the user ``message`` and opens the next assistant turn.
    """
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": _SENTINEL},
        {"role": "user", "content": message},
    ]
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    at = text.find(_SENTINEL)
    if at < 0:
        raise ValueError(
            "the chat template drops assistant messages; K-turn episodes cannot be rendered with it"
        )
    suffix = text[at + len(_SENTINEL) :]
    eos = tokenizer.eos_token or ""
    if reply_ended and eos and suffix.startswith(eos):
        suffix = suffix[len(eos) :]
    return suffix


def _graded(ctx: TurnContext, items: list[Any], *args: Any, **kwargs: Any) -> Any:
    """``ctx.pipeline.score(items, *args, **kwargs)`` for one turn on this rank, agreed with every rank
    (see :func:`fail_together`)."""
    return fail_together(
        lambda: ctx.pipeline.score(items, *args, need_feedback=True, **kwargs),
        ctx.processes,
        "a turn's grading (world model or anchor execution)",
    )


def _value(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def multi_turn_rollout(ctx: TurnContext, prompts: list[Any]) -> dict[str, Any]:
    """Run K-turn episodes for this rank's ``prompts`` (G copies of each, contiguous); TRL's rollout dict."""
    tokenizer = ctx.tokenizer
    n = len(prompts)
    prompt_ids = [
        tokenizer(
            tokenizer.apply_chat_template(
                p, tokenize=False, add_generation_prompt=True, **ctx.template_kwargs
            ),
            add_special_tokens=False,
        )["input_ids"]
        for p in prompts
    ]
    episodes = [ctx.episodes(p, row) for p, row in zip(prompts, ctx.rows, strict=True)]
    completion: list[list[int]] = [[] for _ in range(n)]
    env_mask: list[list[int]] = [[] for _ in range(n)]
    # per completion token: the sampler's log-prob for reply tokens, 0.0 for observation tokens
    # (masked out of the loss and of the importance-sampling ratio by env_mask), as TRL's tool loop does
    logprobs: list[list[float]] | None = [[] for _ in range(n)] if ctx.sampling_logprobs else None
    wm_turns: list[list[float | None]] = [[] for _ in range(n)]
    last_status: list[str | None] = [None] * n
    ledger = ctx.pipeline.ledger

    for _turn in range(ctx.turns):
        start = time.perf_counter()
        generated = ctx.generate(
            [p + c for p, c in zip(prompt_ids, completion, strict=True)], ctx.max_new_tokens
        )
        if ctx.sampling_logprobs:
            replies, reply_logprobs = generated
        else:
            replies, reply_logprobs = generated, None
        elapsed = time.perf_counter() - start
        ledger.add("generation", elapsed, items=n)
        ctx.seconds({"generation": elapsed})
        texts = tokenizer.batch_decode(replies, skip_special_tokens=True)
        items = []
        for i, text in enumerate(texts):
            episodes[i].add_reply(text)
            items.append(ctx.item_fn(text, ctx.rows[i]))
        # every rank takes the same branch at the same turn, so each meets the others in its guard
        if ctx.shadow:
            ctx.anchor = np.zeros(n, dtype=bool)
            ctx.turn_items.append(items)
            scores = _graded(ctx, items, anchor=False)
        elif ctx.anchor is None:
            # Per-rollout anchors: the world model grades the first turn, the plan chooses from its
            # scores which trajectories are executed (at this turn and every later one).
            if ctx.choose is None:
                raise ValueError("TurnContext needs anchor rows or a choose callback")
            scores = _graded(ctx, items, anchor=False)
            ctx.anchor = np.asarray(ctx.choose(scores.wm), dtype=bool)  # a collective: outside the guards
            scores.take_real(_graded(ctx, items, ctx.anchor, world_model=False))
        else:
            scores = _graded(ctx, items, ctx.anchor)
        ctx.seconds(scores.seconds)
        ctx.pipeline.learn(items, scores.real)  # a world model that learns from the run: this turn's outcomes
        ctx.statuses.extend(scores.statuses)
        ctx.real_grades.extend(
            g for g, a in zip(scores.real_grades, ctx.anchor, strict=True) if a and g is not None
        )
        feedback = scores.feedback(ctx.anchor)
        for i in range(n):
            grade = scores.real_grades[i] if ctx.anchor[i] else scores.wm_grades[i]
            reward = grade.value if grade is not None else None
            last_status[i] = grade.status if grade is not None else None
            wm_turns[i].append(_value(scores.wm[i]))
            message = episodes[i].add_outcome(reward, feedback[i], last_status[i])
            reply = replies[i]
            completion[i] += reply
            env_mask[i] += [1] * len(reply)
            if logprobs is not None:
                if len(reply_logprobs[i]) != len(reply):
                    raise ValueError(
                        f"the generator gave {len(reply_logprobs[i])} log-probs for a reply of {len(reply)} tokens"
                    )
                logprobs[i] += [float(x) for x in reply_logprobs[i]]
            if message is not None:
                ended = bool(reply) and reply[-1] in ctx.stop_token_ids
                suffix_ids = tokenizer(
                    feedback_suffix(tokenizer, message, ended, ctx.template_kwargs), add_special_tokens=False
                )["input_ids"]
                completion[i] += suffix_ids
                env_mask[i] += [0] * len(suffix_ids)
                if logprobs is not None:
                    logprobs[i] += [0.0] * len(suffix_ids)

    if ctx.shadow:
        ctx.kept = episodes
    uses_wm = ctx.pipeline.world_model is not None
    anchor = ctx.anchor
    assert anchor is not None  # the first turn sets it, and there is one (turns >= 1, __post_init__)
    wm_value: list[float | None] = []
    real_value: list[float | None] = []
    for i, episode in enumerate(episodes):
        trajectory = episode.reward()  # the stream that produced this row's observations
        if anchor[i]:
            real_value.append(trajectory)
            wm_value.append(episode.aggregate(wm_turns[i]) if uses_wm else None)
        else:
            real_value.append(None)
            wm_value.append(trajectory)
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion,
        # TRL recomputes log-probs with the policy; the sampler's serve vLLM's importance-sampling correction
        "logprobs": logprobs,
        "env_mask": env_mask,
        "wmrl_wm": [None if v is None or math.isnan(v) else float(v) for v in wm_value],
        "wmrl_real": [None if v is None or math.isnan(v) else float(v) for v in real_value],
        "wmrl_status": last_status,
    }


@dataclass
class TrajectoryScores:
    """The real execution of a step's chosen trajectories (:func:`execute_trajectories`).

    ``real``: ``(n,)`` each row's real trajectory reward (NaN: not executed, or unknown);
    ``real_repeat``: ``(n,)`` NaN (K-turn episodes repeat no execution); ``statuses`` and
    ``real_grades``: every executed turn's outcome label and grade (trajectory by trajectory). The
    anchor stream's seconds are booked by the pipeline's ledger as it executes.
    """

    real: npt.NDArray[np.float64]
    real_repeat: npt.NDArray[np.float64]
    statuses: list[str]
    real_grades: list[Any]


def execute_trajectories(
    pipeline: RewardPipeline,
    turn_items: Sequence[Sequence[Any]],
    episodes: Sequence[TurnEpisode],
    rows: npt.NDArray[np.bool_],
) -> TrajectoryScores:
    """Execute the ``rows`` (``(n,)`` bool) trajectories of a shadow rollout for real.

    Every turn of a chosen trajectory is executed (as in a synchronous K-turn step, the execution
    memory skips none: a trajectory reward needs each turn's outcome), all turns in one batch: no turn
    waits for another's outcome, since the policy was shown the world model's. Its real reward is
    ``episodes[i].aggregate(real turn rewards)``. Called off the critical path, by the worker thread of
    :class:`~wmrl.core.late.AnchorsInFlight`.
    """
    rows = np.asarray(rows, dtype=bool)
    n = rows.shape[0]
    if len(episodes) != n or any(len(items) != n for items in turn_items):
        raise ValueError(
            f"execute_trajectories needs one episode and one item per turn for each of the {n} rows"
        )
    turns = len(turn_items)
    flat = [item for items in turn_items for item in items]  # turn-major: turn k's row i at k * n + i
    scores = pipeline.score(flat, np.tile(rows, turns), world_model=False, need_feedback=True)
    real = np.full(n, np.nan)
    grades: list[Any] = []
    for i in np.flatnonzero(rows):
        turn_grades = [scores.real_grades[k * n + i] for k in range(turns)]
        grades.extend(g for g in turn_grades if g is not None)
        value = episodes[i].aggregate([g.value if g is not None else None for g in turn_grades])
        real[i] = np.nan if value is None else float(value)
    return TrajectoryScores(real, np.full(n, np.nan), list(scores.statuses), grades)
