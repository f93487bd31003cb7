"""Great Expectations, kept out of ``sentcl``: the validate stage's expectations on the parsed tables."""
