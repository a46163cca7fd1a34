"""Tools: the operations behind the MCP tools and the CLI, one rollout at a time.

Owns the endpoint pool (each engine certified once, one capture proxy per usable endpoint:
``endpoint``), engine sets (several engines certified as one model, one per rollout, drained on
failure: ``engines``), one rollout from request to result and the in-memory rollout store and
graph views (``rollouts``), rollouts in flight (``jobs``), task references and the task listing
(``tasks``), and what this machine can run (``info``).

May import: ``harnesses``, ``sessions``, ``datasets`` (a sequence as a training row), ``result``,
``capture`` and the base modules. Never ``collect``, ``trl``, ``engine`` or ``server``: they
call into it.
"""
