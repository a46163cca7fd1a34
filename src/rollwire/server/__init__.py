"""Server: the ``rollwire`` command line, the MCP server and the web UI (the top layer).

Owns the CLI (``cli`` and one module per command group), the MCP app over one server state
(``mcp_app``, the compact tool list of ``surface``), ``rollwire demo``, and the read-only web UI
(``ui``, ``ui_static``).

May import every layer below it (``collect``, ``trl``, ``engine``, ``tools``, ``harnesses``,
``sessions``, ``datasets``, ``result``, ``capture``, the base modules); nothing but
``rollwire.__main__`` imports it. Inside it, layers too: ``cli`` imports the command modules
(``collect_cli``, ``agents_cli``, ``images_cli``, ``demo``), never the reverse; they import
``mcp_app``, then ``ui``; the shared declarations (``options``, ``arguments``, ``surface``)
import no command.
"""
