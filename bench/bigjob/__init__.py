"""A big job's evidence bundle (hundreds to thousands of nodes) for bench/bench_bigjob.py."""
