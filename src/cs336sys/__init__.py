"""cs336sys: CS336 Assignment 2 (Systems and Parallelism) as a library and a Snakemake pipeline."""

__version__ = "0.1.0"
