"""``python -m scaleflu.radio.medium``: run a broker (see scaleflu.radio.medium_cli)."""

from scaleflu.radio.medium_cli import main

raise SystemExit(main())
