"""Hang detection: the job-wide view, learned thresholds, the FR poll, the busy check, classification."""
