"""The policy and the domain the core loop trainer drives.

The policy is one categorical distribution per hyperparameter and per task (``logits[task][k]``), so a
configuration's log-probability is the sum over hyperparameters; GRPO pushes it towards configurations
whose (corrected) scores beat their group's. Sampling is a pure function of ``(seed, step)``, so the
checkpoint needs only the logits and the optimiser for a bit-identical resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from wmrl.core import Group, StepResult
from wmrl_hpo.config import HPOConfig
from wmrl_hpo.tasks import SPACE, Rollout, cross_validated


class HPODomain:
    """A :class:`wmrl.core.loop.LoopDomain`: groups of G configurations per task.

    It trains on late anchors too (``late_anchors``): an earlier step's groups whose executions landed
    at this step, with their late advantages (``result.late``), as a plain stale gradient (a
    configuration's log-probability under the current logits; its rollouts keep what they are).
    """

    late_anchors = True

    def __init__(self, config: HPOConfig) -> None:
        self.config = config
        self.tasks = list(config.tasks)
        sizes = [len(o) for o in SPACE.values()]
        self.logits = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(len(self.tasks), n)) for n in sizes
        )
        self.optimizer = torch.optim.Adam(self.logits.parameters(), lr=config.learning_rate)

    def groups(self, step: int) -> list[str]:
        """The tasks of this step's groups, in rotation."""
        n = self.config.groups_per_step
        return [self.tasks[(step * n + j) % len(self.tasks)] for j in range(n)]

    def rollout(self, groups: Sequence[str], step: int) -> list[Group]:
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        out = []
        for j, task in enumerate(groups):
            t = self.tasks.index(task)
            picks = [
                torch.multinomial(
                    torch.softmax(logits[t].detach(), 0), self.config.group_size, True, generator=generator
                )
                for logits in self.logits
            ]
            items = [
                Rollout(task, tuple(int(p[i]) for p in picks), seed=step * 10_007 + j * 101 + i)
                for i in range(self.config.group_size)
            ]
            out.append(Group(key=f"{step}:{j}:{task}", items=items, task=task))
        return out

    def update(self, batch: list[Group], result: StepResult, step: int) -> Mapping[str, float | None]:
        # this step's groups, then the earlier groups whose executions landed now (late anchors)
        groups = list(batch) + [g for late in result.late for g in late.groups]
        matrices = [np.asarray(result.advantages, dtype=float)] + [late.advantages for late in result.late]
        width = max(m.shape[1] for m in matrices)
        padded = [np.pad(m, ((0, 0), (0, width - m.shape[1])), constant_values=np.nan) for m in matrices]
        raw = np.concatenate(padded, axis=0)
        advantages = torch.as_tensor(np.nan_to_num(raw, nan=0.0), dtype=torch.float32)
        known = torch.as_tensor(~np.isnan(raw), dtype=torch.float32)
        logp = torch.zeros_like(advantages)
        for g, group in enumerate(groups):
            t = self.tasks.index(group.task)
            for i, rollout in enumerate(group.items):
                logp[g, i] = sum(
                    torch.log_softmax(logits[t], 0)[c]
                    for logits, c in zip(self.logits, rollout.choice, strict=True)
                )
        # normalised by this step's rollouts: a late correction adds to the step, it does not dilute it
        own = torch.as_tensor(~np.isnan(np.asarray(result.advantages, dtype=float)), dtype=torch.float32)
        loss = -(advantages * logp * known).sum() / own.sum().clamp(min=1)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"policy/loss": float(loss.detach())}

    def metrics(self, batch: list[Group], result: StepResult) -> Mapping[str, float | None]:
        """The true score of the greedy configuration per task (real execution, a fixed seed): what was learned."""
        if not self.config.report_greedy:
            return {}
        scores = [cross_validated(Rollout(task, self.greedy(task), seed=0)) for task in self.tasks]
        return {"policy/greedy_true_score": float(np.mean(scores))}

    def greedy(self, task: str) -> tuple[int, ...]:
        t = self.tasks.index(task)
        return tuple(int(torch.argmax(logits[t])) for logits in self.logits)

    def completion_columns(self, batch: list[Group]) -> Mapping[str, Sequence[str]]:
        return {"config": [r.describe() for g in batch for r in g.items]}

    def save(self, folder: Path) -> None:
        torch.save(
            {"logits": self.logits.state_dict(), "optimizer": self.optimizer.state_dict()},
            folder / "policy.pt",
        )

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "policy.pt", weights_only=True)
        self.logits.load_state_dict(state["logits"])
        self.optimizer.load_state_dict(state["optimizer"])
