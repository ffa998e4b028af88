"""The fleet view: what the verdict store says about the whole cluster, not one job.

- ``queries``  the store's aggregates in SQL (GPU-hours lost, distinct hardware events, drain
               outcomes, latencies): the one place the report and the metrics read them from
- ``facts``    ``sattr report --fleet``'s data (docs/fleet.md)
- ``metrics``  the same aggregates in Prometheus' exposition format (docs/metrics.md)
- ``html``     the self-contained HTML page of the report

Data flows one way: store -> queries -> facts/metrics -> html/CLI.
"""
