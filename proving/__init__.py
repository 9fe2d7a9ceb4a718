"""Where our promises are shown: the demo, the benchmark and the chaos suite.

The framework (`consumers`, `dedupe`, `providers`) never imports this package;
the CLI loads `proving.demo`, `proving.bench` and `proving.chaos` by name when
one of those commands runs, and an import-linter contract keeps it so.
"""
