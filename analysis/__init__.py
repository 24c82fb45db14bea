"""Analysis: load the records into one DataFrame, compute speedups/tau/scores, draw figures."""
