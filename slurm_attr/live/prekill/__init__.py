"""Evidence before the kill: the leader/nodes dump exchange, its spool files' shapes, the dumps as evidence."""
