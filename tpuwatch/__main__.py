"""``python -m tpuwatch``."""

from tpuwatch.cli import main

raise SystemExit(main())
