"""The one definition of in-domain versus held-out initial states.

Every LIBERO task has 50 fixed initial states. WMRL trains on states 0-15 ("in-domain") and keeps
states 16-49 ("held-out") for evaluation only. This is the split the official WMRL trainer uses
(initial state = group index mod 16) and the one the paper's LIBERO-Long numbers fit: for every row
of its table, Overall = 0.32 * In-Domain + 0.68 * OOD = (16 * ID + 34 * OOD) / 50. (The official
``data.py`` describes a different 40/10 split that the published numbers do not fit.)

The trainer samples initial states from :func:`states_for_split` ``("in_domain")``; ``wmrl eval
libero`` reports both splits with the same function, so the two can never drift apart.
"""

from __future__ import annotations

__all__ = ["IN_DOMAIN_STATES", "NUM_INIT_STATES", "SPLITS", "split_of", "states_for_split"]

NUM_INIT_STATES = 50
"""Initial states per task in every LIBERO suite."""

IN_DOMAIN_STATES: tuple[int, ...] = tuple(range(16))
"""Initial-state indices used for training (and reported as in-domain)."""

SPLITS: tuple[str, ...] = ("all", "in_domain", "held_out")


def split_of(state: int) -> str:
    """``"in_domain"`` for a training initial state, ``"held_out"`` for the others."""
    if not isinstance(state, int) or isinstance(state, bool) or state < 0:
        raise ValueError(f"an initial-state index must be a non-negative integer; got {state!r}")
    return "in_domain" if state in IN_DOMAIN_STATES else "held_out"


def states_for_split(split: str, num_states: int = NUM_INIT_STATES) -> tuple[int, ...]:
    """The initial-state indices of a split, in increasing order.

    Args:
        split: ``"all"``, ``"in_domain"`` (0-15) or ``"held_out"`` (16 onwards).
        num_states: how many initial states the task has (50 in LIBERO).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if num_states < 1:
        raise ValueError(f"num_states must be >= 1; got {num_states}")
    states = range(num_states)
    if split == "all":
        return tuple(states)
    return tuple(s for s in states if split_of(s) == split)


def parse_indices(text: str) -> tuple[int, ...]:
    """``"0,2,5-7"`` -> ``(0, 2, 5, 6, 7)``: task or initial-state indices, ranges inclusive.

    Raises:
        ValueError: not integers or ranges, a range that runs backwards, or nothing at all.
    """
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                first, last = int(lo), int(hi)
                if last < first:
                    raise ValueError(f"range {part!r} runs backwards")
                out.extend(range(first, last + 1))
            else:
                out.append(int(part))
        except ValueError as err:
            if "backwards" in str(err):
                raise
            raise ValueError(f"expected integers or ranges like 0,2,5-7; got {text!r}") from None
    if not out:
        raise ValueError(f"expected at least one index; got {text!r}")
    return tuple(out)
