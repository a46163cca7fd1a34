"""Capture: the record of what the model saw and sampled, and the checks that make it trainable.

Owns the capture proxy (an OpenAI-spec front door; the Responses, Anthropic and Gemini wire
dialects translated to chat-completions), capture sessions (one per rollout, its id the agent's
API key), the one upstream client to the engine, the checks on every reply (ingest), the rollout
graph (model calls linked by exact token prefix), token-in continuation (splice, token_paths),
endpoint certification and logprob parity, and the rollout document a trainer reads (export),
with its findings.

May import: nothing of rollwire but the base modules (bounds, roots, serving), and today none of
them. It is the bottom package layer: every other package builds on it.
"""
