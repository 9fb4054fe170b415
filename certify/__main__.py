"""`python -m certify` is the console script `certify`."""

from certify.cli import console

console()
