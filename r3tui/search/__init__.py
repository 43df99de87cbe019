"""search layer of R³."""
