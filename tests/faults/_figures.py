"""Figures the fault scenarios measured, printed in the terminal summary."""

from __future__ import annotations

FIGURES: list[str] = []


def report(scenario: str, **values: object) -> None:
    shown = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    FIGURES.append(f"{scenario}: {shown}")
