"""The benchmarks: a script per question, run from the checkout. The GPU questions are scenario files
(``scenarios/NAME.yaml``) that ``run.py`` runs; what the scripts share is ``harness.py`` (and ``manual.py``,
the release's steps by hand). They import the product; the product never imports them (pyproject.toml's
contracts)."""
