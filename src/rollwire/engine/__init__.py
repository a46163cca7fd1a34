"""The embedded CPU reference engine (``rollwire engine``): a real small chat model, vLLM-shaped.

A dev/test/demo engine so rollwire produces real trainable rollouts on a laptop with no GPU;
production points ``--llm-url`` at vLLM or SGLang. Needs the ``engine`` extra.
"""
