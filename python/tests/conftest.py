"""What the tests share: the repository's root, and a counting helper for the scripted models."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return ROOT
