"""Fixtures shared by the sandbox test files."""

import pytest

from wmrl.autoresearch.sandbox import make_sandbox


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory):
    """``get(name, **options)``: one sandbox per (backend, options) for the test module, built on first use."""
    made = {}

    def get(name: str, **options):
        key = (name, tuple(sorted(options.items())))
        if key not in made:
            made[key] = make_sandbox(name, output_root=tmp_path_factory.mktemp(f"sb-{name}"), **options)
        return made[key]

    return get
