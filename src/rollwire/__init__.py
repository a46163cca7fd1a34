"""rollwire: turn LLM-agent rollouts into trainable data."""
