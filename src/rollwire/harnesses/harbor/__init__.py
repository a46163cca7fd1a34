"""Harbor tasks without Docker: datasets, the ``local`` bubblewrap sandbox and a trial runner.

Needs the ``harbor`` extra (and Debian's ``bubblewrap`` for the local sandbox). Submodules are
imported on use. Importing any of them first sets two settings Harbor reads at import, unless
the caller set them: no telemetry, and litellm's bundled cost map (else it fetches one from the
internet, with retries).
"""

import os

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
