"""Tasks: data loading, prompt rendering and scoring, one file per task family."""
