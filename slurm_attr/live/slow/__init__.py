"""Slow anomalies (S1-S3): the nodes' ring entries, the leader's join and tracker, the post-mortem evidence."""
