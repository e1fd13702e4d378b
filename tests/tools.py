"""Tools beside Python that some tests need (chromium, helm, node): skipped without them on a
developer's machine, a failure under CI, where their install step must have worked."""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    """`CI` is set to true (GitHub Actions, GitLab and most runners set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(name: str, found: object, install: str) -> None:
    """Go on when `found` is truthy (a path, a check's result). Otherwise skip the test, or under
    CI fail it: the step `install` (how the tool gets here) failed, and a skip would hide that."""
    if found:
        return
    message = f"{name} is missing: {install}"
    if under_ci():
        pytest.fail(f"{message}; that step failed (under CI a missing tool fails the test)", pytrace=False)
    pytest.skip(message)
