"""``python -m rollwire``: the command line (the top layer; imports only ``server``)."""

from rollwire.server.cli import main

raise SystemExit(main())
