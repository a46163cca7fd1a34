"""Harnesses: where a rollout's task and agent actually run, as a ``RolloutResult``.

Owns the env families (``envs``: reasoning-gym, OpenSpiel, TextArena and BrowserGym as tool-only
sessions, and one env episode from session to result through an in-process capture proxy) and
Harbor (``harbor``: task datasets, the ``local`` bubblewrap and ``docker`` sandboxes, agent
installs and images, the trial runner, and the gate that is a sandboxed agent's only way out, to
its capture session).

May import: ``sessions``, ``result``, ``capture`` and the base modules (``serving`` for the
proxy and gate servers a trial's agent reaches, ``bounds``). Never ``tools``, ``collect`` or
``server``: an MCP tool or a collection calls a harness, not the other way round. Each family's
third-party library is imported on use (extras ``envs``, ``browser``, ``harbor``).
"""
