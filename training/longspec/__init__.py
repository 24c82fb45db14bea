"""Training the LongSpec draft: `python -m training.longspec [field=value ...]` for one run,
`python -m training.longspec.recipe <recipe.yaml>` for a chain of runs (conf/train/)."""
