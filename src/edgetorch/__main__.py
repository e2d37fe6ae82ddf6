"""``python -m edgetorch``: same as the ``edgetorch`` console script."""

from edgetorch.cli.main import main

raise SystemExit(main())
