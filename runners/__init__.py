"""The one runner (timing, records, audit, W&B mirror)."""
