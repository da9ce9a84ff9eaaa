"""A world model learned from the run's own executions, beside the language model (beyond the paper; option).

With ``world_model.surrogate.enabled``, training grades with a
:class:`~wmrl.core.surrogate.FusedWorldModel` of two sources:

1. the language-model :class:`~wmrl.autoresearch.worldmodel.WorldModel` (the primary: its predicted
   status and feedback go with every grade, so K-turn episodes observe what they did before);
2. a :class:`~wmrl.core.surrogate.SurrogateSource`: per task, the mean real reward of the ``k``
   executed scripts nearest to this one in a bag-of-code embedding (:func:`code_features`).

Each is calibrated linearly to the real reward and weighted by the inverse of its own measured
error, measured on executions before they are learned. The execution memory already grades a script
executed before (exact key); the surrogate is for *variants* of executed scripts, such as another
``max_depth`` in the same model block, which share most of their code and often their outcome.

The embedding: the script's syntax tree (:func:`~wmrl.autoresearch.tasks.normalised.normalised_code`,
so comments and formatting do not count), split into identifiers and numbers, word n-grams of them
hashed into ``dimensions`` buckets (scikit-learn's ``HashingVectorizer``), L2-normalised: the squared
distance of two scripts is ``2 − 2·cos``, in ``[0, 2]`` for scripts with nonnegative counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from wmrl.core.surrogate import Floats, FusedWorldModel, NearestNeighbours, SurrogateSource

__all__ = ["SurrogateConfig", "code_features", "with_surrogate"]

#: identifiers, and numbers with their decimals and exponent kept whole (``0.05`` is one token)
_TOKENS = r"[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


@dataclass(frozen=True)
class SurrogateConfig:
    """``world_model.surrogate``: the world model learned from the run (see the module docstring).

    Attributes:
        enabled: fuse it with the language model (modes that execute and use a world model: ``wmrl``).
        k: executed neighbours averaged.
        radius: neighbours farther than this Euclidean distance in the embedding do not count
            (``null``: any; ``1.0`` means a cosine similarity of at least 0.5); a script with none is
            unknown to the surrogate and graded by the language model alone.
        dimensions: hashed embedding size.
        ngrams: the longest word n-gram embedded (``3``: ``n_estimators Constant 100`` is one feature).
        max_points: executions kept per task (the oldest are forgotten); memory ``8·dimensions`` bytes each.
        min_pairs: executed rollouts each source needs scored before it is calibrated and weighted;
            until then the language model's score is used as it is.
    """

    enabled: bool = False
    k: int = 3
    radius: float | None = None
    dimensions: int = 1024
    ngrams: int = 3
    max_points: int = 4096
    min_pairs: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"world_model.surrogate.enabled must be a bool; got {self.enabled!r}")
        for name, low in (("k", 1), ("dimensions", 8), ("ngrams", 1), ("max_points", 1), ("min_pairs", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"world_model.surrogate.{name} must be an int >= {low}; got {value!r}")
        if self.radius is not None and (
            isinstance(self.radius, bool) or not isinstance(self.radius, (int, float)) or not self.radius > 0
        ):
            raise ValueError(f"world_model.surrogate.radius must be > 0 or null; got {self.radius!r}")


@functools.lru_cache(maxsize=8)
def _vectoriser(dimensions: int, ngrams: int) -> Any:
    """scikit-learn's stateless hashing vectoriser, built once per setting (not once per script)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(
        n_features=dimensions,
        token_pattern=_TOKENS,
        lowercase=False,
        ngram_range=(1, ngrams),
        alternate_sign=False,  # counts stay nonnegative: distances in [0, 2]
        norm="l2",
    )


def code_features(code: str, dimensions: int = 1024, ngrams: int = 3) -> Floats:
    """``(dimensions,)`` float64: the L2-normalised hashed n-gram counts of ``code``'s syntax tree
    (all zeros for a script without a token)."""
    from wmrl.autoresearch.tasks.normalised import normalised_code

    row = _vectoriser(dimensions, ngrams).transform([normalised_code(code)])
    return np.asarray(row.toarray()[0], dtype=np.float64)


def _task(item: Any) -> str:
    return str(item.task_id)


def with_surrogate(language_model: Any, config: SurrogateConfig) -> FusedWorldModel:
    """The language model fused with a surrogate of ``config`` (partitioned by task)."""
    surrogate = SurrogateSource(
        lambda item: code_features(item.code, config.dimensions, config.ngrams),
        NearestNeighbours(k=config.k, radius=config.radius, max_points=config.max_points),
        name="surrogate",
        partition=_task,
    )
    from wmrl.autoresearch.tasks.normalised import solution_key

    # a script's identity across engines that rebuild their items: the execution memory's key
    return FusedWorldModel(
        [language_model, surrogate],
        min_pairs=config.min_pairs,
        name=language_model.name,
        item_key=solution_key,
    )
