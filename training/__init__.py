"""Training for the components that need it (the LongSpec draft: `python -m training.longspec`)."""
