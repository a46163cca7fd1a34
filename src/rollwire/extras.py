"""The optional extras (pyproject.toml's ``optional-dependencies``): which extra installs which
third-party module, and the one way rollwire tells a user to install one. A base module: it
imports nothing of rollwire's, and every layer may use it."""

from __future__ import annotations

#: a third-party module → the extra that installs it: a command that needs a missing extra says
#: which one instead of a traceback (``server/cli.py``; a test checks it against pyproject)
EXTRA_OF_MODULE = {
    "llama_cpp": "engine",
    "jinja2": "engine",
    "reasoning_gym": "envs",
    "pyspiel": "envs",
    "textarena": "envs",
    "browsergym": "browser",
    "miniwob": "browser",
    "playwright": "browser",
    "harbor": "harbor",
    "docker": "harbor",
    "pyarrow": "datasets",
    "datasets": "datasets",
    "huggingface_hub": "datasets",
    "torch": "train",
    "transformers": "train",
    "trl": "train",
    "accelerate": "train",
    "gguf": "train",
    "ray": "ray",
}


def install_hint(extra: str) -> str:
    """What to run for ``extra``, installed and in a clone: ``install the X extra: pip install
    'rollwire[X]' (in a clone: uv run --extra X ...)``."""
    return (
        f"install the {extra} extra: pip install 'rollwire[{extra}]' "
        f"(in a clone: uv run --extra {extra} ...)"
    )
