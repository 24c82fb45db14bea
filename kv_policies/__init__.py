"""KV policies: which cached positions a query may see. One file per policy."""
