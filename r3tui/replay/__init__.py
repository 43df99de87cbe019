"""replay layer of R³."""
