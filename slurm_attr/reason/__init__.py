"""Reasoning steps of the verdict that look across symptoms: when each failure happened
(timeline), whether a trusted source contradicts an untrusted claim (contradiction), which rank
failed first (firstfailure), which attempt a line belongs to (attempt) and which node all failing
network connections share (netloc). Each step annotates symptoms; verdict.decide chooses."""
