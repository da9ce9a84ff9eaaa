"""The run log of a TRL run (``metrics.jsonl`` through a :class:`~wmrl.core.runlog.RunWriter`) and its progress bar."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

__all__ = ["RunLogCallback"]


class RunLogCallback(TrainerCallback):
    """Writes every TRL log (its metrics plus the corrector's ``wmrl/*`` and ``cost/*``) to a
    :class:`~wmrl.core.runlog.RunWriter` and shows a progress bar over optimiser steps.

    Args:
        writer: the run's writer.
        progress: show a tqdm bar (reward and realised anchor fraction as its postfix).
        total: optimiser steps of the run.
        desc: the bar's label (the stage: ``GRPO``, ``SFT``).
        shown: ``(log key, postfix name)`` pairs shown after the bar (default: reward and anchors).
    """

    def __init__(
        self,
        writer: Any,
        progress: bool = True,
        total: int | None = None,
        desc: str = "GRPO",
        shown: tuple[tuple[str, str], ...] = (
            ("reward", "reward"),
            ("wmrl/anchor_fraction_realised", "anchors"),
        ),
    ) -> None:
        self.writer = writer
        self.progress = progress
        self.total = total
        self.desc = desc
        self.shown = shown
        self.bar: Any = None  # the tqdm bar while training runs

    def set_phase(self, name: str) -> None:
        """Show what the step in progress is doing (generation, scoring, update)."""
        if self.bar is not None:
            self.bar.set_description_str(f"{self.desc} · {name}", refresh=True)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=self.total or state.max_steps, initial=state.global_step, desc=self.desc, unit="step"
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs:
            return
        self.writer.log(state.global_step, logs)
        if self.bar is not None:
            shown = {}
            for key, name in self.shown:
                if logs.get(key) is not None:
                    shown[name] = f"{logs[key]:.3f}"
            self.bar.set_postfix(shown, refresh=True)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
