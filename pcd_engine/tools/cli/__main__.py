"""``python -m pcd_engine.tools.cli``: the ``pcd`` command."""

from pcd_engine.tools.cli.command import main

raise SystemExit(main())
