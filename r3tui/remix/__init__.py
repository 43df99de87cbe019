"""remix layer of R³."""
