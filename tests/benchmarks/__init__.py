"""Tests of the scripts in benchmarks/ that turn committed results into the README's numbers."""
