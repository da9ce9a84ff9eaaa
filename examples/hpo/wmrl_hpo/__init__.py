"""A third WMRL domain, written only against ``wmrl.core``'s public API: hyperparameter search as RL.

See ``docs/new-domain.md`` in the WMRL repository for the walk-through.
"""
