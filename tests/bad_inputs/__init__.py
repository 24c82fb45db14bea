"""Bad command lines a user might type, each of which must end in exactly one `error:` line, a non-zero
exit, no traceback and nothing written (neither under the run's out dir nor in the repository).

`python -m tests.bad_inputs` runs every case through `run.py` and prints, per case, one of
clean / traceback / accepted (exit 0: the bad value was silently taken) / noisy (non-zero exit but
not one clean line) / wrote (something was written), then the counts. `tests/test_bad_inputs.py` runs
the same list in the default suite (the cases the pre-flight check refuses, in process; a few end to
end).

`{file}` in an argument becomes a path to an existing plain file, `{dir}` and `{folder}` an existing
folder, `{ro}` a folder on a read-only file system when the machine has one (the case is skipped
otherwise), and `{data:<name>}` a data file written from `DATA_FILES[<name>]` (a binary file, Latin-1
text, a fake .gz, MT-Bench rows with bad turns, ...); a case's `env` sets environment variables for
it, with the same placeholders.

`RECORD_CASES` damage the records of a real small run; they need a run to damage, so
`tests/test_damaged_records.py` runs them (not this CLI).

The modules: `command` (a case: `Case`, `_c`), `cases` (`CASES`, the command lines), `data_files`
(`DATA_FILES`, and the cases that read them, spliced into `CASES` where their section stands),
`records` (`RECORD_CASES`), `running` (placeholders, one case through run.py, its outcome) and
`__main__` (the command line above).
"""

from tests.bad_inputs.cases import CASES
from tests.bad_inputs.command import Case
from tests.bad_inputs.data_files import DATA_FILES, data_file
from tests.bad_inputs.records import RECORD_CASES, RecordCase
from tests.bad_inputs.running import classify, expand, expand_env, hydra_dirs, readonly_dir, run_case

__all__ = [
    "CASES",
    "DATA_FILES",
    "RECORD_CASES",
    "Case",
    "RecordCase",
    "classify",
    "data_file",
    "expand",
    "expand_env",
    "hydra_dirs",
    "readonly_dir",
    "run_case",
]
