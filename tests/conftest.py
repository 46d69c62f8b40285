"""Shared test setup: import paths (repo root, the router's policy package)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "model_repository" / "router_bls" / "1"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
