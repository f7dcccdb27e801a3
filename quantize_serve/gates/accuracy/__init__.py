"""The accuracy gate: lm-evaluation-harness against the base's and the candidate's servers (run.py, with
lm-eval's model in scoring.py, its lanes and host work), which documents it scores (documents.py), what it
records (results.py), and the paired, sequential rule that decides (recovery.py over paired.py's
statistics; docs/gates.md)."""
