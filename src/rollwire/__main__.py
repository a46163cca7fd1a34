from rollwire.server.cli import main

raise SystemExit(main())
