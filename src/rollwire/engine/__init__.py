"""The embedded CPU reference engine (``rollwire engine``): a real small chat model, vLLM-shaped.

A dev/test/demo engine so rollwire produces real trainable rollouts on a laptop with no GPU;
production points ``--llm-url`` at vLLM or SGLang. Needs the ``engine`` extra.

Owns the model (sampling and scoring over llama.cpp or torch), the vLLM-shaped server with
vLLM's weight-sync routes (``weights``), the chat template of a converted folder, and
``rollwire convert``. May import only ``capture`` (the Hermes text tool format its prompts share
with the tool loop) and the base module ``checkpoints`` (the checks a checkpoint passes before
it is served); only ``server`` imports it, so nothing a rollout or a collection runs depends on
the reference engine (layer contract: a forbidden contract keeps it off everything else).
"""
