"""compile layer of R³."""
