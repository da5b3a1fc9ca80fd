"""Summary of the depth study: written in full later."""
from pathlib import Path


def write_summary(out: Path) -> None:
    print("summary: not yet")
