"""rollwire: turn LLM-agent rollouts into trainable data.

The packages are layers, each importing only those below it: ``server``; ``trl``, ``collect``,
``engine``; ``tools``; ``harnesses``; ``sessions``, ``datasets``; ``result``; ``capture``; the
base modules ``bounds``, ``roots``, ``serving``. The map is docs/architecture.md; the contract that
holds it is ``[tool.importlinter]`` in pyproject.toml (``lint-imports``).
"""
