"""`python -m certify` runs what the console script `certify` runs, and exits the ordinary way (with
the interpreter's teardown, which cli.console skips), so that `python -m cProfile -m certify ...`
and other tools that act after the module returns see the whole run."""

from certify.cli import main

raise SystemExit(main())
