"""``python -m umahub``: the same as the ``umahub`` command."""

from umahub.cli import main

raise SystemExit(main())
