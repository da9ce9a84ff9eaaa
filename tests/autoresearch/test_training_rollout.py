"""K-turn rollouts through TRL's ``rollout_func``: feedback as the next observation, masked from the loss.

The feedback text each row received is rebuilt independently (a real re-grading of its turn-1
script for anchor groups, the world model's prediction for world-model groups, formatted by the
agent package) and must appear verbatim among that row's masked tokens, and only there.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_grpo import cpu_grpo_config


def test_feedback_suffix_closes_the_turn_and_opens_the_next():
    pytest.importorskip("transformers")
    from wmrl.autoresearch.llm.tiny import build_tiny_tokenizer
    from wmrl.core.engines.trl import feedback_suffix

    tok = build_tiny_tokenizer()
    assert (
        feedback_suffix(tok, "MSG", reply_ended=True)
        == "\n<|im_start|>user\nMSG<|im_end|>\n<|im_start|>assistant\n"
    )
    assert feedback_suffix(tok, "MSG", reply_ended=False).startswith("<|im_end|>\n<|im_start|>user\nMSG")
    # the suffix continues a rendered conversation exactly as the template renders the whole of it
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "reply"}]
    head = (
        tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True) + "reply<|im_end|>"
    )
    whole = tok.apply_chat_template(
        [*messages, {"role": "user", "content": "MSG"}], tokenize=False, add_generation_prompt=True
    )
    assert head + feedback_suffix(tok, "MSG", reply_ended=True) == whole


@pytest.mark.trl
@pytest.mark.bwrap
@pytest.mark.parametrize("design", ["groups", "rollouts", "surrogate"])
def test_two_turn_rollout(tmp_path, design):
    """K = 2 turns with whole anchor groups (chosen from keys) and with per-rollout anchors, the
    default (each group's top-scored trajectory after the first turn, executed at both turns);
    ``surrogate``: per-rollout anchors with the world model fused with a surrogate, which keeps the
    language model's feedback and learns every executed turn."""
    from datasets import Dataset

    from wmrl.autoresearch.agent.episode import EpisodeConfig
    from wmrl.autoresearch.agent.feedback import ExecutionFeedback, format_feedback
    from wmrl.autoresearch.agent.prompts import next_user_message
    from wmrl.autoresearch.agent.tokens import HFTokens
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.llm import TransformersBackend, load_model
    from wmrl.autoresearch.sandbox import SandboxPool, make_sandbox
    from wmrl.autoresearch.tasks import load_task
    from wmrl.autoresearch.tasks.toy import make_toy_task
    from wmrl.autoresearch.training.episodes import episode_factory
    from wmrl.autoresearch.training.streams import solution_items
    from wmrl.autoresearch.training.tiny_coder import train_tiny_coder
    from wmrl.autoresearch.worldmodel import WorldModel, WorldModelConfig
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer
    from wmrl.core.rollouts import Exact

    make_toy_task(tmp_path, "toy-regression", time_limit_s=30)
    make_toy_task(tmp_path, "toy-binary", kind="binary", time_limit_s=30)
    prompt = [
        {"role": "system", "content": "You write scripts."},
        {"role": "user", "content": "Write a script for the task."},
    ]
    rows = [
        {"prompt": prompt, "prompt_id": t, "task_id": t, "task_ref": str(tmp_path / t)}
        for t in ("toy-regression", "toy-binary")
    ]
    coder = tmp_path / "coder"
    train_tiny_coder([prompt], save_to=coder)
    policy, frozen = load_model(coder), load_model(coder)
    anchor = ExecutionRewardSource(
        ExecutionGrader(sandbox=SandboxPool(make_sandbox("bwrap"), slots=2, cache="memory")), max_workers=2
    )
    wm = WorldModel(
        TransformersBackend(frozen.model, frozen.tokenizer, model_id="tiny-coder"),
        WorldModelConfig(scoring="status_probs", worked_example=False, overview_tokens=600),
        task_resolver=load_task,
    )
    world_model = wm
    if design == "surrogate":  # not measured yet in one step: it grades as the language model does
        from wmrl.autoresearch.worldmodel.surrogate import SurrogateConfig, with_surrogate

        world_model = with_surrogate(wm, SurrogateConfig(enabled=True))
    episode = EpisodeConfig(turns=2, feedback_max_tokens=300)
    trainer = WMRLGRPOTrainer(
        model=policy.model,
        processing_class=policy.tokenizer,
        args=cpu_grpo_config(
            tmp_path / "out",
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=96,
            max_steps=1,
            save_strategy="no",
            seed=0,
            temperature=1.0,
        ),
        train_dataset=Dataset.from_list(rows),
        corrector=Corrector(
            CorrectorConfig.preset("wmrl_groups") if design == "groups" else CorrectorConfig()
        ),
        mode="wmrl",
        world_model=world_model,
        anchor=anchor,
        episodes=episode_factory(episode, policy.tokenizer),
        turns=episode.turns,
        item_fn=solution_items(),
    )
    items = []
    make = solution_items()
    trainer.item_fn = lambda text, row: items.append(make(text, row)) or items[-1]
    rollouts, outputs = [], []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, tr: rollouts.append(rollout(prompts, tr)) or rollouts[-1]
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: outputs.append(generate(inputs)) or outputs[-1]
    trainer.train()

    out = rollouts[0]
    n = len(out["completion_ids"])
    assert n == 4 and len(items) == 2 * n  # two turns of four rows
    anchor_rows = [i for i in range(n) if out["wmrl_real"][i] is not None]
    if design == "groups":
        assert len(anchor_rows) == 2 and anchor_rows in ([0, 1], [2, 3]), (
            "exactly one anchor group (the floor)"
        )
    else:
        # a quota of half of each group of 2: its better-scored trajectory after the first turn
        assert len(anchor_rows) == 2 and {i // 2 for i in anchor_rows} == {0, 1}
        first = [t.value if isinstance(t, Exact) else wm.score([t])[0] for t in items[:n]]
        for i in anchor_rows:
            other = i + 1 if i % 2 == 0 else i - 1
            assert first[i] is not None and (first[other] is None or first[i] >= first[other])
    tok = policy.tokenizer
    grader = ExecutionGrader(backend="bwrap")
    counter = HFTokens(tok)
    for i in range(n):
        ids, mask = out["completion_ids"][i], out["env_mask"][i]
        assert len(ids) == len(mask) and mask[0] == 1 and mask[-1] == 1
        env_text = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        model_text = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
        first = items[i]
        if isinstance(first, Exact):
            feedback = first.feedback
        elif i in anchor_rows:
            feedback = ExecutionFeedback.from_result(grader.grade(load_task(first.task_id), first.code))
        else:
            feedback = wm.predict([first])[0].feedback
        message = next_user_message(format_feedback(feedback, episode.feedback_max_tokens, counter), 1, 2)
        assert message in env_text, f"row {i} did not receive its own feedback"
        assert "Result of attempt" not in model_text, "feedback tokens leaked into the trained tokens"
        # the trajectory rewards: best turn; anchor rows pair it with the world model's best turn
        turns = [items[i], items[n + i]]
        if i in anchor_rows:
            real = [
                t.value if isinstance(t, Exact) else grader.grade(load_task(t.task_id), t.code).reward
                for t in turns
            ]
            assert out["wmrl_real"][i] == pytest.approx(max(real))
            predicted = [t.value if isinstance(t, Exact) else wm.score([t])[0] for t in turns]
            assert out["wmrl_wm"][i] == pytest.approx(max(predicted))
        else:
            assert out["wmrl_real"][i] is None
    # TRL masks the feedback tokens out of the loss: its tool_mask is our env_mask
    tool_mask = outputs[0]["tool_mask"].numpy()
    for i in range(n):
        row = np.asarray(out["env_mask"][i])
        assert (tool_mask[i, : len(row)] == row).all()
    assert trainer.corrector.debiaser.n_pairs == 2  # the anchor group's two trajectories
    if design == "surrogate":  # both turns of every executed trajectory, each a real outcome
        executed = [t for i in anchor_rows for t in (items[i], items[n + i]) if not isinstance(t, Exact)]
        assert executed and len(world_model.sources[1]) == len(executed)


@pytest.mark.trl
def test_two_turn_rollout_masks_feedback_of_malformed_replies(tmp_path):
    """The random tiny model writes no script: every turn is graded exactly (``malformed``, no source
    call), and the rollout still threads the feedback through the chat template and the mask."""
    from datasets import Dataset

    from wmrl.autoresearch.agent.episode import EpisodeConfig
    from wmrl.autoresearch.agent.feedback import ExecutionFeedback, format_feedback
    from wmrl.autoresearch.agent.prompts import next_user_message
    from wmrl.autoresearch.agent.tokens import HFTokens
    from wmrl.autoresearch.grading import ExecutionGrader, ExecutionRewardSource
    from wmrl.autoresearch.llm import TransformersBackend
    from wmrl.autoresearch.llm.tiny import build_tiny_model
    from wmrl.autoresearch.training.episodes import episode_factory
    from wmrl.autoresearch.training.streams import solution_items
    from wmrl.autoresearch.worldmodel import WorldModel
    from wmrl.core.corrector import Corrector, CorrectorConfig
    from wmrl.core.engines.trl import WMRLGRPOTrainer

    model, tok = build_tiny_model()
    frozen, frozen_tok = build_tiny_model()
    prompt = [{"role": "system", "content": "You write scripts."}, {"role": "user", "content": "Solve it."}]
    rows = [
        {"prompt": prompt, "prompt_id": f"p{k}", "task_id": f"t{k}", "task_ref": f"t{k}"} for k in range(2)
    ]
    anchor = ExecutionRewardSource(ExecutionGrader(backend="subprocess"))
    wm = WorldModel(TransformersBackend(frozen, frozen_tok), overview_fn=lambda ref: "# TASK\nnone")
    executed = []
    anchor.grade_results = lambda items: executed.extend(items) or []
    episode = EpisodeConfig(turns=2)
    trainer = WMRLGRPOTrainer(
        model=model,
        processing_class=tok,
        args=cpu_grpo_config(
            tmp_path / "out",
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=8,
            max_steps=1,
            save_strategy="no",
        ),
        train_dataset=Dataset.from_list(rows),
        corrector=Corrector(CorrectorConfig()),
        mode="wmrl",
        world_model=wm,
        anchor=anchor,
        episodes=episode_factory(episode, tok),
        turns=episode.turns,
        item_fn=solution_items(),
    )
    rollouts, outputs = [], []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, tr: rollouts.append(rollout(prompts, tr)) or rollouts[-1]
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: outputs.append(generate(inputs)) or outputs[-1]
    trainer.train()
    out = rollouts[0]
    assert not executed and wm.stats.items == 0, "malformed replies are graded exactly, by neither source"
    message = next_user_message(
        format_feedback(
            ExecutionFeedback("malformed", reward=0.0), episode.feedback_max_tokens, HFTokens(tok)
        ),
        1,
        2,
    )
    tool_mask = outputs[0]["tool_mask"].numpy()
    for i, (ids, mask) in enumerate(zip(out["completion_ids"], out["env_mask"], strict=True)):
        env = [t for t, m in zip(ids, mask, strict=True) if m == 0]
        assert message in tok.decode(env)
        replies = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
        assert "Result of attempt" not in replies
        assert (tool_mask[i, : len(mask)] == np.asarray(mask)).all()
    anchors = [v for v in out["wmrl_real"] if v is not None]
    assert anchors == [0.0, 0.0] and out["wmrl_wm"] == [0.0] * 4
