"""slurm-attr's accuracy benchmark (run.py is the entry; README.md says how it works)."""
