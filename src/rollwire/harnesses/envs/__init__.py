"""Environment adapters: each env family as tool-only agent sessions."""
