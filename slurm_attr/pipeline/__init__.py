"""After a job ends, on the controller. The stages, in the order the data flows:

``intake``     the durable pending record: one small fsynced file per ended job on local disk
               until its verdict is stored (every later stage reads or updates it)
``ctldrecord`` EpilogSlurmctld: the job's facts from the hook's own environment into the intake;
               nothing else (no RPC, no user file read, no analysis)
``settle``     the job's final state from accounting (slurmctld's word while accounting is down)
``catchup``    the jobs accounting saw end that the intake never got (a lost or torn hook record, a
               hook that never ran), recorded after all with accounting's facts: one sacct a run
``finish``     analyse, store, drain, comment (``reconcile``: the fast path's drains into the store)

and the three that drive them: ``pool`` (at most ``[analysis] workers`` workers drain the intake,
at low priority), ``batch`` (a batch of jobs: accounting asked once, comments written together;
the workers' batches and `sattr retry`'s) and ``attempt`` (one job's attempt: stored, left pending
with its error and a backoff, or partial). A stage imports only earlier stages; only the drivers import stages
(tests/unit/test_pipeline_layout.py). hooks.py is the entry point Slurm runs; ``sattr retry`` (a
timer) takes what a worker left pending.
"""
