"""The K-turn rollout (TRL ``rollout_func``): K attempts per rollout, each graded, each result the next observation.

Called by TRL with this rank's prompts (G copies of each, contiguous). The anchor/world-model
decision was already made for each group, from keys only, before generation
(``WMRLGRPOTrainer._generate_and_score_completions``), so every turn of an anchor group is
executed for real and every turn of a world-model group is graded by the world model:

* turn ``t``: the policy generates a reply for every row from ``prompt + everything so far``
  (one batched, left-padded ``generate``); the reply is parsed (:func:`solution_items`);
* anchor rows run in the sandbox while the world model predicts every row's outcome (world-model
  rows: their reward and feedback; anchor rows: the world-model half of their calibration pair),
  concurrently, in two threads;
* the outcome becomes the next user message through the agent's own :class:`Episode` (the same
  :func:`format_feedback` for real and predicted runs), rendered with the chat template and
  appended to the completion with ``env_mask = 0``, so feedback tokens never enter the loss.

The completion TRL trains on is ``reply_1 + feedback_1 + reply_2 + ... + reply_K`` as token ids
(the reply tokens are exactly those sampled; nothing is re-tokenised). Rewards: a row's trajectory
reward is the configured aggregation of its turn rewards (best turn by default); anchor rows also
get the world model's aggregate over their turns (max for ``best``), which pairs with the real
reward for calibration. Both are returned as extra fields (``wmrl_real``, ``wmrl_wm``) that TRL
merges into the rows ``_calculate_rewards`` reads.

Generation here uses the transformers model in process (vLLM is not wired into the K-turn path).
"""

from __future__ import annotations

import copy
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from trl.models import unwrap_model_for_generation

from wmrl.autoresearch.agent.episode import Episode, trajectory_reward
from wmrl.autoresearch.agent.feedback import ExecutionFeedback
from wmrl.autoresearch.agent.tokens import HFTokens
from wmrl.autoresearch.training.streams import Exact, TurnOutcome

if TYPE_CHECKING:
    from wmrl.autoresearch.training.trainer import WMRLGRPOTrainer

__all__ = ["feedback_suffix", "multi_turn_rollout"]

_SENTINEL = "\u2063WMRL-REPLY\u2063"


def feedback_suffix(
    tokenizer: Any, message: str, reply_ended: bool, template_kwargs: dict | None = None
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
    text = tokenizer.apply_chat_template(
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


def _episode_for(prompt: Any, config, tokens) -> Episode:
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
        raise TypeError(
            "K-turn rollouts need conversational prompts (a list of {'role', 'content'} messages)"
        )
    system = prompt[0]["content"] if prompt[0].get("role") == "system" else ""
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if len(users) != 1 or len(prompt) != (2 if system else 1):
        raise ValueError(
            "K-turn prompts must be [system, user] or [user] (the task overview as the one user message)"
        )
    return Episode(system, users[0], config, tokens=tokens)


def _generate(trainer: WMRLGRPOTrainer, contexts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Sample one reply per context; returns the new token ids (through the first end token, if any)."""
    tokenizer = trainer.processing_class
    pad = tokenizer.pad_token_id
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for r, context in enumerate(contexts):
        ids[r, width - len(context) :] = torch.tensor(context)
        mask[r, width - len(context) :] = 1
    device = trainer.accelerator.device
    config = copy.deepcopy(trainer.generation_config)
    config.max_new_tokens = max_new_tokens
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
    ):
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
        )
    stops = set(trainer.eos_token_ids)
    replies = []
    for row in out[:, width:].tolist():
        reply = []
        for token in row:
            reply.append(token)
            if token in stops:
                break
        while reply and reply[-1] == pad and pad not in stops:
            reply.pop()
        replies.append(reply)
    return replies


def multi_turn_rollout(trainer: WMRLGRPOTrainer, prompts: list) -> dict[str, Any]:
    """Run K-turn episodes for this rank's ``prompts``; returns TRL's rollout dict (see module docstring)."""
    step, inputs = trainer._wmrl_step, trainer._wmrl_inputs
    if step is None or inputs is None or step.plan is None or len(inputs) != len(prompts):
        raise RuntimeError("multi_turn_rollout runs inside WMRLGRPOTrainer's generation step only")
    if trainer.use_vllm:
        raise ValueError(
            "K-turn rollouts generate with the in-process transformers model; set use_vllm=False"
        )
    tokenizer = trainer.processing_class
    cfg = trainer.episode
    counter = HFTokens(tokenizer)
    anchor = trainer._local_anchor_rows(step)
    n = len(prompts)
    template = trainer.chat_template_kwargs
    prompt_ids = [
        tokenizer(
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **template),
            add_special_tokens=False,
        )["input_ids"]
        for p in prompts
    ]
    episodes = [_episode_for(p, cfg, counter) for p in prompts]
    completion: list[list[int]] = [[] for _ in range(n)]
    env_mask: list[list[int]] = [[] for _ in range(n)]
    wm_turns: list[list[float | None]] = [[] for _ in range(n)]
    stops = set(trainer.eos_token_ids)
    ledger = trainer.ledger

    for _turn in range(cfg.turns):
        start = time.perf_counter()
        replies = _generate(
            trainer,
            [p + c for p, c in zip(prompt_ids, completion, strict=True)],
            trainer.max_completion_length,
        )
        elapsed = time.perf_counter() - start
        ledger.add("generation", elapsed, items=n)
        step.add_time("generation", elapsed)
        texts = tokenizer.batch_decode(replies, skip_special_tokens=True)
        items = []
        for i, text in enumerate(texts):
            episodes[i].add_reply(text)
            items.append(trainer.item_fn(text, inputs[i]))
        exact = [isinstance(item, Exact) for item in items]
        real_rows = [i for i in range(n) if anchor[i] and not exact[i]] if trainer._turn_real else []
        wm_rows = [i for i in range(n) if not exact[i]] if trainer._turn_wm else []
        exact_anchor = sum(1 for i in range(n) if anchor[i] and exact[i])
        if exact_anchor and trainer._turn_real:
            ledger.add("anchor", 0.0, items=exact_anchor)  # graded exactly: free items (see the trainer)
        if any(exact) and trainer._turn_wm:
            ledger.add("world_model", 0.0, items=sum(exact))
        real_out: dict[int, TurnOutcome] = {}
        wm_out: dict[int, TurnOutcome] = {}

        def run(grader, rows, stream, sink, items=items):
            if not rows:
                return
            t0 = time.perf_counter()
            try:
                results = grader([items[i] for i in rows])
            finally:
                took = time.perf_counter() - t0
                ledger.add(stream, took, items=len(rows))
                step.add_time(stream, took)
            sink.update(zip(rows, results, strict=True))

        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(run, trainer._turn_real, real_rows, "anchor", real_out),
                pool.submit(run, trainer._turn_wm, wm_rows, "world_model", wm_out),
            ]
            for future in futures:
                future.result()

        for i in range(n):
            if anchor[i] and trainer._turn_real:
                step.statuses.append(items[i].status if exact[i] else real_out[i].feedback.status)
            if exact[i]:
                item = items[i]
                feedback = item.feedback or ExecutionFeedback(
                    "harness_error" if item.value is None else "malformed", reward=item.value
                )
                wm_turns[i].append(item.value)
            else:
                chosen = real_out[i] if anchor[i] else wm_out[i]
                feedback = chosen.feedback
                wm_turns[i].append(wm_out[i].reward if i in wm_out else None)
            message = episodes[i].add_feedback(feedback)
            reply = replies[i]
            completion[i] += reply
            env_mask[i] += [1] * len(reply)
            if message is not None:
                ended = bool(reply) and reply[-1] in stops
                suffix = feedback_suffix(tokenizer, message, ended, template)
                suffix_ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
                completion[i] += suffix_ids
                env_mask[i] += [0] * len(suffix_ids)

    wm_value: list[float | None] = []
    real_value: list[float | None] = []
    for i, episode in enumerate(episodes):
        trajectory = episode.reward()  # the stream that produced this row's feedback
        if anchor[i]:
            real_value.append(trajectory)
            wm_value.append(
                trajectory_reward(wm_turns[i], cfg.aggregation, cfg.unknown) if trainer._turn_wm else None
            )
        else:
            real_value.append(None)
            wm_value.append(trajectory)
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion,
        "logprobs": None,  # TRL recomputes log-probs with the policy; sampling log-probs only serve vLLM
        "env_mask": env_mask,
        "wmrl_wm": [None if v is None or math.isnan(v) else float(v) for v in wm_value],
        "wmrl_real": [None if v is None or math.isnan(v) else float(v) for v in real_value],
    }
