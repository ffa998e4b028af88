"""slurm-attr: why a distributed GPU training job failed on Slurm, with the evidence."""

__version__ = "0.1.0"
