"""Sessions: one episode as the agent sees it, and the built-in loop that drives a model through it.

Owns the agent-side episode interface (``base``: a ``ResourceSession`` offers messages and tools,
never the orchestration verbs reset/step/state/close), any reset/step environment as such a
session (``stepenv``), and the white-box tool loop (``toolloop``) whose every model call goes
through a capture proxy.

May import: ``result``, ``capture`` and the base modules. Never ``datasets`` (its sibling in the
layer contract), ``harnesses``, ``tools`` or anything above: environments (harnesses) and
collections (collect) build on it.
"""
