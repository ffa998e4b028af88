"""After a job ends, on the controller: record -> pool -> (retry.process: settle, analyse, publish).

``record``  EpilogSlurmctld: the job's facts from the hook's own environment into the durable
            intake, a worker started when a slot is free; nothing else (no RPC, no analysis).
``pool``    at most ``[analysis] workers`` workers drain the intake in batches, at low priority.
"""
