"""ui layer of R³."""
