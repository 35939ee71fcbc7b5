"""Markdown tables of the experiment reports: one row format and one table head for all."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table_row(cells: Iterable[str]) -> str:
    """One Markdown table row of ``cells``."""
    return "| " + " | ".join(cells) + " |"


def table_head(title: str, head: Sequence[str]) -> list[str]:
    """A ``###`` section title, a blank line, the header row ``head`` and its rule."""
    return [f"### {title}", "", table_row(head), "|" + "---|" * len(head)]
