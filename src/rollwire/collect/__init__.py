"""Collections: many rollouts run as one crash-safe, resumable dataset.

Owns the orchestration above single rollouts: the deterministic work list, groups and seeds,
bounded concurrency, filters, resume and halting (``collection``), and running the episodes on a
Ray cluster's nodes while this process alone writes the store (``cluster``).

May import: ``tools`` (the endpoint pool, engine sets, one rollout's plan and attempt, task
references), ``harnesses`` (Harbor datasets, to resolve a task set), ``sessions``, ``datasets``
(the episode store and its records), ``result``, ``capture`` and the base modules. Only ``server``
(the CLI and the MCP ``collect_episodes`` tool) imports it.
"""
