"""record layer of R³."""
